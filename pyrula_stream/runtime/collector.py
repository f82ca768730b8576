"""How a worker process sets up CPython's garbage collector.

A turn allocates a few thousand short-lived objects (records, events, dicts, futures).
With CPython's default young-generation threshold (700 allocations) the collector runs
every few steps, and each full collection walks every module, agent and tool object the
process built at startup: in the bench that was a fifth of the worker's CPU per turn.
A worker process freezes what exists when it starts (it lives as long as the process)
and collects the young generation every ``YOUNG_THRESHOLD`` allocations instead. Cycles
are still collected; only less often, and never among the frozen startup objects.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Net allocations between two young-generation collections (CPython's default: 700)."""


def tune_for_worker() -> None:
    """Freeze the objects alive now and raise the young-generation threshold.

    For the process that runs workers (``run_worker``, the bench): it changes the whole
    interpreter, so a library embedding a worker in its own application may skip it.
    """
    gc.collect()
    gc.freeze()
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, young), older, oldest)
