"""Deadlines for turns and tool calls: one timer per event loop, not one per deadline.

``asyncio.timeout`` puts a timer handle on the loop's heap each time it is entered and
cancels it on exit. A worker enters two per turn (the agent's timeout and the tool's), with
thousands of turns open at once, and nearly all of them exit long before they expire.
Here a deadline joins a bucket of ``TICK_S`` seconds, held in a dict so an exit takes it
out at once (and an emptied bucket with it: what is held is what is open), and one timer
per loop, set for the earliest bucket, cancels the tasks whose time has come. A deadline
fires up to ``TICK_S`` late, never early. The timer may find its bucket gone (its
deadlines ended in time); it then moves to the earliest left, so it wakes at most once a
tick.

The rest is ``asyncio.timeout``'s contract: the task is cancelled, and that cancellation
becomes ``TimeoutError`` where the ``async with`` block exits; a cancellation from
elsewhere passes through untouched.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
import weakref
from types import TracebackType

TICK_S = 0.05
"""How finely deadlines are told apart: the most a deadline fires late."""


class _Sweep:
    """The open deadlines of one event loop, by bucket, and the one timer for them."""

    __slots__ = ("_buckets", "_context", "_loop", "_timer", "_timer_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        """Weakly: ``_SWEEPS`` holds this by the loop, which must be free to go."""
        self._context = contextvars.Context()
        """The timer's own: armed from a turn's task, it must not keep that turn's context."""
        self._buckets: dict[int, dict[Deadline, None]] = {}
        """Bucket number (its end, in ``TICK_S`` of the loop's clock) -> its deadlines."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def add(self, deadline: Deadline, when: float, loop: asyncio.AbstractEventLoop) -> int:
        number = math.ceil(when / TICK_S)
        bucket = self._buckets.get(number)
        if bucket is None:
            bucket = self._buckets[number] = {}
            if number < self._timer_at:
                self._arm(number, loop)
        bucket[deadline] = None
        return number

    def remove(self, deadline: Deadline, number: int) -> None:
        bucket = self._buckets.get(number)
        if bucket is not None:
            bucket.pop(deadline, None)
            if not bucket:
                del self._buckets[number]

    def _arm(self, number: int, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = number
        self._timer = loop.call_at(number * TICK_S, self._fire, context=self._context)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = sorted(n for n in self._buckets if n * TICK_S <= now)
        for number in due:
            for deadline in self._buckets.pop(number):
                deadline._expire()
        if self._buckets:
            self._arm(min(self._buckets), loop)


_SWEEPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Sweep] = weakref.WeakKeyDictionary()
_SWEEPS_LOCK = threading.Lock()
_last: _Sweep | None = None
"""The sweep found last: a worker's loop asks for its own on every turn."""


def _sweep_of(loop: asyncio.AbstractEventLoop) -> _Sweep:
    global _last
    last = _last  # one read: another thread's loop may replace it meanwhile
    if last is not None and last._loop() is loop:
        return last
    with _SWEEPS_LOCK:
        sweep = _SWEEPS.get(loop)
        if sweep is None:
            sweep = _SWEEPS[loop] = _Sweep(loop)
    _last = sweep
    return sweep


class Deadline:
    """``async with Deadline(seconds)``: like ``asyncio.timeout(seconds)`` (``None``: no
    deadline), at the cost of a dict entry instead of a timer handle."""

    __slots__ = ("_bucket", "_cancelling", "_delay", "_expired", "_sweep", "_task")

    def __init__(self, delay: float | None) -> None:
        self._delay = delay
        self._expired = False
        self._task: asyncio.Task[object] | None = None
        self._sweep: _Sweep | None = None
        self._bucket: int | None = None
        self._cancelling = 0

    def expired(self) -> bool:
        """Whether this deadline cancelled its task (a ``TimeoutError`` is then ours)."""
        return self._expired

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadline must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        if self._delay is not None:
            loop = task.get_loop()
            self._sweep = _sweep_of(loop)
            self._bucket = self._sweep.add(self, loop.time() + self._delay, loop)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bucket is not None and self._sweep is not None:
            self._sweep.remove(self, self._bucket)
            self._bucket = None
        if (
            self._expired
            and self._task is not None
            and self._task.uncancel() <= self._cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc

    def _expire(self) -> None:
        """The sweep's call once the deadline passed: cancel the task (once)."""
        self._bucket = None
        if not self._expired and self._task is not None:
            self._expired = True
            self._task.cancel()
