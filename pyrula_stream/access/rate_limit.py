"""Per-key rate limits for the HTTP faces: one caller's flood does not become everyone's.

A token bucket per caller: the principal the ``HTTPGuard`` let in (the key's name), or
the client's address without keys. Each request takes a token; a caller with none left
gets ``429`` with ``Retry-After``. ``RateLimit`` sits inside the guard, so the principal
is known when it runs. Buckets of callers idle long enough to be full again are dropped.
"""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from dataclasses import dataclass

from pyrula_stream.access.http_guard import ASGIApp, Receive, Scope, Send, principal_of
from pyrula_stream.errors import ConfigurationError, ErrorCode

MAX_BUCKETS = 100_000
"""Callers remembered at once (the oldest are dropped first: they are full again)."""


@dataclass(frozen=True)
class RatePolicy:
    """``per_second`` requests on average, up to ``burst`` at once, per caller."""

    per_second: float
    burst: int

    def __post_init__(self) -> None:
        if not self.per_second > 0 or self.burst < 1:
            raise ConfigurationError(
                f"a rate limit needs per_second > 0 and burst >= 1, got {self!r}"
            )


class Buckets:
    """The callers' token buckets (one event loop uses it: no lock)."""

    def __init__(self, policy: RatePolicy) -> None:
        self.policy = policy
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, caller: str, now: float | None = None) -> float:
        """``0`` when the caller may go on (a token taken), else the seconds until it may."""
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.get(caller, (float(self.policy.burst), now))
        tokens = min(float(self.policy.burst), tokens + (now - at) * self.policy.per_second)
        if tokens >= 1:
            self._buckets[caller] = (tokens - 1, now)
            self._buckets.move_to_end(caller)
            while len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
            return 0.0
        self._buckets[caller] = (tokens, now)
        return (1 - tokens) / self.policy.per_second


class RateLimit:
    """ASGI middleware: ``429`` for an HTTP request of a caller out of tokens."""

    def __init__(self, app: ASGIApp, policy: RatePolicy) -> None:
        self.app = app
        self.buckets = Buckets(policy)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        principal = principal_of(scope)
        client = scope.get("client") or ("", 0)
        caller = f"key:{principal}" if principal is not None else f"addr:{client[0]}"
        wait = self.buckets.take(caller)
        if wait == 0:
            await self.app(scope, receive, send)
            return
        body = json.dumps(
            {
                "error": "too many requests from this caller; retry later",
                "code": ErrorCode.BACKPRESSURE_REJECTED,
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 429,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"retry-after", str(max(1, math.ceil(wait))).encode()),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


__all__ = ["Buckets", "RateLimit", "RatePolicy"]
