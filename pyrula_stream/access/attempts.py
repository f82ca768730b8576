"""Failed attempts slow down: a client that keeps presenting wrong keys waits longer and
longer for each refusal, so guessing a key over HTTP takes a lifetime.

The first wrong key from a client (a typo) is answered at once; each one after it waits
twice as long as the one before, from ``base_s`` up to ``max_s``, before its ``401``. A
valid key is never slowed, and does not clear the count (a holder of one key could
otherwise interleave it to guess another's). A client's count is forgotten
``forget_after_s`` after its last failure. Clients are told apart by address: behind a
proxy they share one, and its callers share the delay.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class FailedAttempts:
    """Wrong-key counts per client address, and the wait each next refusal takes."""

    base_s: float = 0.5
    max_s: float = 5.0
    forget_after_s: float = 900.0
    max_clients: int = 10_000
    """Counts kept at most (the oldest dropped first): a flood of addresses costs memory
    bounded by this, not by the flood."""
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    clock: Callable[[], float] = time.monotonic
    _failures: OrderedDict[str, tuple[int, float]] = field(default_factory=OrderedDict)

    def failed(self, client: str) -> float:
        """Count a wrong key from ``client``; the seconds its refusal should wait."""
        now = self.clock()
        count, last = self._failures.pop(client, (0, now))
        if now - last > self.forget_after_s:
            count = 0
        count += 1
        self._failures[client] = (count, now)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)
        return 0.0 if count == 1 else min(self.max_s, self.base_s * 2 ** (count - 2))

    async def slow_down(self, client: str) -> None:
        """Count a wrong key and wait as long as the count says."""
        delay = self.failed(client)
        if delay > 0:
            await self.sleep(delay)
