"""How a worker process sets up CPython's garbage collector and glibc's allocator.

A turn allocates a few thousand short-lived objects (records, events, dicts, futures).
With CPython's default young-generation threshold (700 allocations) the collector runs
every few steps, and each full collection walks every module, agent and tool object the
process built at startup: in the bench that was a fifth of the worker's CPU per turn.
A worker process freezes what exists when it starts (it lives as long as the process)
and collects the young generation every ``YOUNG_THRESHOLD`` allocations instead. Cycles
are still collected; only less often, and never among the frozen startup objects.

The middle generation is collected every ``YOUNG_THRESHOLD x MIDDLE_THRESHOLD`` (500,000)
allocations. What survives a young collection is mostly a step's records waiting for
their commit, dead soon after; collected every 100,000 allocations, they were promoted to
the oldest generation, and every full collection walks that generation whole. In a long
turn it is large (each turn's conversation and journal): 200-step turns spent a third of
the worker's CPU in the collector, and a step cost more the longer its turn had run.

The young generation was first collected every 10,000 allocations (and the middle every
50 young collections). With thousands of turns in flight, what a turn allocates mostly
lives until its model call returns, so a young collection walked objects it could not
free: with 20,000 turns in flight (bench ``concurrency`` phase, two alternating runs each)
the worker spent 4.5 s of its 30 s of CPU in the collector, against 1.3 s of 25 s with
50,000 (and 10): 0.62 instead of 0.75 ms per turn, 0.90-0.91 of the ideal instead of
0.78. The other phases moved within their spread (per one-step turn, instant model: 0.35
against 0.33 ms; with a 200 ms model 0.52-0.54 either way; per step of a 1,000-step
turn 0.130-0.135 either way), and the longest event-loop stall of the keyed phase was
17-36 ms against 13-23 ms: a young collection walks more at once.

glibc gives a thread that allocates while another holds the lock an arena of its own
(up to 8 per core), and memory freed in one arena is reused only by it. A worker's
threads (librdkafka's, ``asyncio.to_thread``'s polls and commits) each built an arena of
record copies and batches that stayed resident: one arena cut the bench's resident set
per in-flight turn by about a seventh, at no cost to its throughput.
"""

from __future__ import annotations

import ctypes
import gc
import sys

YOUNG_THRESHOLD = 50_000
"""Net allocations between two young-generation collections (CPython's default: 700)."""

MIDDLE_THRESHOLD = 10
"""Young collections between two of the middle generation (CPython's default: 10)."""

M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter for the most arenas it makes (``malloc.h``)."""


def tune_for_worker() -> None:
    """Freeze the objects alive now, raise the young and middle generations' thresholds,
    and keep glibc to one malloc arena.

    For the process that runs workers (``run_worker``, the bench): it changes the whole
    interpreter, so a library embedding a worker in its own application may skip it.
    Call it before the worker's threads start: an arena, once made, stays.
    """
    gc.collect()
    gc.freeze()
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, young), max(MIDDLE_THRESHOLD, older), oldest)
    one_malloc_arena()


def one_malloc_arena() -> bool:
    """Ask glibc for a single malloc arena (see the module docstring); whether it took it.
    Elsewhere (macOS, musl) nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, 1))
