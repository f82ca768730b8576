"""The cache behind ``@tool(cache_ttl=...)`` and ``ctx.cache``.

``CacheStore`` is the small async interface the worker implements over its shared store.
``InProcessCacheStore`` is a dict with expiry, for hand-built contexts and unit tests: it
is not shared between processes, so a real deployment passes its own store.
``CacheProxy`` is what a tool sees as ``ctx.cache``: every key is namespaced by the tool's
name so two tools cannot read or clobber each other's entries by accident.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.wire import guard

__all__ = [
    "CacheProxy",
    "CacheStore",
    "CallbackCacheStore",
    "InProcessCacheStore",
    "read_cached_result",
    "tool_cache_key",
    "write_cached_result",
]

logger = logging.getLogger(__name__)


@runtime_checkable
class CacheStore(Protocol):
    """A key-value store with per-entry expiry. ``None`` is never a stored value."""

    async def get(self, key: str) -> Any | None:
        """The value, or ``None`` when missing or expired."""
        ...

    async def set(self, key: str, value: Any, ttl_s: float) -> None:
        """Store ``value`` under ``key`` for ``ttl_s`` seconds."""
        ...


class InProcessCacheStore:
    """A dict with expiry; values are kept as given (not copied), so store immutable ones.

    ``clock`` is injectable so expiry can be tested without sleeping. ``max_entries`` bounds
    memory in a long-running test or tool: expired entries go first, then the oldest.
    """

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, max_entries: int = 10_000
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._clock = clock
        self._max_entries = max_entries
        self._entries: dict[str, tuple[float, Any]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> Any | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_at, value = entry
        if self._clock() >= expires_at:
            del self._entries[key]
            return None
        return value

    async def set(self, key: str, value: Any, ttl_s: float) -> None:
        self._entries.pop(key, None)  # re-insert so dict order tracks the newest write
        if ttl_s <= 0 or value is None:
            return
        self._entries[key] = (self._clock() + ttl_s, value)
        if len(self._entries) > self._max_entries:
            self._evict()

    def _evict(self) -> None:
        now = self._clock()
        for key in [k for k, (expires_at, _) in self._entries.items() if now >= expires_at]:
            del self._entries[key]
        while len(self._entries) > self._max_entries:
            del self._entries[next(iter(self._entries))]


class CallbackCacheStore:
    """Adapts the seed-style sync ``cache_getter`` / ``cache_setter`` pair to ``CacheStore``.

    A missing getter reads as a miss and a missing setter drops writes, so a context built
    with only one of them still works.
    """

    def __init__(
        self,
        getter: Callable[[str], Any | None] | None,
        setter: Callable[[str, Any, float], None] | None,
    ) -> None:
        self._getter = getter
        self._setter = setter

    async def get(self, key: str) -> Any | None:
        return None if self._getter is None else self._getter(key)

    async def set(self, key: str, value: Any, ttl_s: float) -> None:
        if self._setter is not None:
            self._setter(key, value, ttl_s)


class CacheProxy:
    """``ctx.cache``: a ``CacheStore`` seen through the tool's namespace ``tool:<name>:``."""

    def __init__(self, store: CacheStore, tool_name: str | None) -> None:
        self._store = store
        self.namespace = f"tool:{tool_name or ''}:"

    def key_for(self, key: str) -> str:
        """The key as the store sees it."""
        if not isinstance(key, str):
            raise TypeError(f"cache keys are str, got {type(key).__name__}")
        return self.namespace + key

    async def get(self, key: str) -> Any | None:
        return await self._store.get(self.key_for(key))

    async def set(self, key: str, value: Any, *, ttl: float) -> None:
        """Store ``value`` for ``ttl`` seconds (> 0); ``None`` cannot be stored."""
        # ``not ttl > 0`` also refuses NaN.
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0:
            raise ValueError(f"ttl must be a number of seconds > 0, got {ttl!r}")
        if value is None:
            raise ValueError("None cannot be cached: get() returns None for a miss")
        await self._store.set(self.key_for(key), value, float(ttl))


def tool_cache_key(tool_name: str, canonical_arguments: str) -> str:
    """Where ``@tool(cache_ttl=...)`` keeps one call's result.

    The prefix differs from ``ctx.cache``'s ``tool:<name>:`` so a tool's own keys cannot
    collide with its cached results; the arguments are hashed to keep keys short.
    """
    digest = hashlib.sha256(canonical_arguments.encode("utf-8")).hexdigest()
    return f"tool-result:{tool_name}:{digest}"


async def read_cached_result(store: CacheStore, key: str) -> tuple[Any, str] | None:
    """A cached ``(value, text)``, or ``None``. A broken store reads as a miss: it is a cache.

    Only the text is stored (a str survives any store); a non-str value is rebuilt from its
    JSON, so a pydantic model comes back as its dict.
    """
    try:
        entry = await store.get(key)
    except Exception:
        logger.warning("cache read of %r failed; treating it as a miss", key, exc_info=True)
        return None
    if not (isinstance(entry, Mapping) and isinstance(entry.get("text"), str)):
        return None
    text: str = entry["text"]
    try:
        value = text if entry.get("is_str") else guard.loads(text, "cached tool result")
    except MalformedRecordError:
        return None
    return value, text


async def write_cached_result(
    store: CacheStore, key: str, value: Any, text: str, ttl_s: float
) -> None:
    """Cache one successful result; a failing store is logged, never fatal to the call."""
    try:
        await store.set(key, {"text": text, "is_str": isinstance(value, str)}, ttl_s)
    except Exception:
        logger.warning("cache write of %r failed", key, exc_info=True)
