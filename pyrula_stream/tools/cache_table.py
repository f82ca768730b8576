"""The in-memory table behind the shared tool cache, with no broker client in sight.

``CacheTable`` is what every worker holds of the compacted cache topic (the design is in
``pyrula_stream.kafka.stores.cache``; reading and following the topic is
``pyrula_stream.kafka.table.GlobalTable``): live entries with their wall-clock expiry, this
worker's own writes still on their way through the log, and expired keys still owed a
tombstone. It decides what a read returns and what a record read from the log changes;
``KafkaCacheStore`` moves the records. The table is shared by the event loop and the
reader thread, so every method takes its lock.

A record's value is ``{"v": <value>, "exp": <epoch ms>}`` (``encode_entry``/``decode_entry``);
a tombstone is no value at all. Our own writes carry ``WRITER_HEADER``, expiry tombstones
``EXPIRED_HEADER``.
"""

from __future__ import annotations

import copy
import json
import math
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from pyrula_stream.errors import MalformedRecordError, UserError
from pyrula_stream.wire import guard

__all__ = [
    "EXPIRED_HEADER",
    "WRITER_HEADER",
    "CacheTable",
    "Entry",
    "decode_entry",
    "encode_entry",
    "now_ms",
]

WRITER_HEADER = "pyrula-cache-writer"  # "<store id>:<seq>" on every set and delete
EXPIRED_HEADER = "pyrula-cache-expired"  # on expiry tombstones: the "exp" they remove

Entry = tuple[Any, int]
"""``(value, expires_at_ms)``."""


def now_ms() -> int:
    """Wall-clock epoch milliseconds: what expiries are measured in."""
    return time.time_ns() // 1_000_000


def encode_entry(key: str, value: Any, ttl_s: float) -> tuple[bytes, Entry]:
    """The record value storing ``value`` for ``ttl_s`` seconds, and the entry it makes.

    ``UserError`` when ``ttl_s`` is not finite or ``value`` is not JSON. The entry holds a
    JSON round trip of ``value``, so the table never shares an object with the caller.
    """
    if not math.isfinite(ttl_s):
        raise UserError(f"ttl_s must be a finite number of seconds, got {ttl_s!r}")
    try:
        v_text = json.dumps(
            value,
            separators=(",", ":"),
            sort_keys=True,
            ensure_ascii=False,
            allow_nan=False,
        )
    except (TypeError, ValueError) as exc:
        raise UserError(
            f"the cache value for {key!r} is not JSON-serializable ({exc}); the shared "
            "cache stores JSON: str, numbers, bools, lists and dicts"
        ) from exc
    exp = now_ms() + max(1, math.ceil(ttl_s * 1000))
    payload = f'{{"v":{v_text},"exp":{exp}}}'.encode()
    return payload, (json.loads(v_text), exp)


def decode_entry(value: bytes) -> Entry:
    """The entry one record value holds; ``MalformedRecordError`` when it is not ours."""
    record = guard.loads_object(value, "cache record")
    if "v" not in record:
        raise MalformedRecordError('expected a JSON object {"v": ..., "exp": ...}')
    exp = record.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int):
        raise MalformedRecordError(f'"exp" must be epoch milliseconds, got {exp!r:.50}')
    return record["v"], exp


def _expiry_removed(headers: Mapping[str, str]) -> int | None:
    """The expiry an expiry tombstone removes; ``None`` for a plain (unconditional) delete."""
    raw = headers.get(EXPIRED_HEADER)
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


class CacheTable:
    """Entries by key, with read-your-writes and expiry bookkeeping (see the module doc).

    Own writes: ``begin_write`` applies a write locally at once and returns its token, which
    travels with the record (``WRITER_HEADER``). Until the reader reads that token back
    (``apply``), older records of the key are ignored: they precede the write in the log.
    ``forget_write`` drops a write that never reached the log.

    Expiry: an expired entry reads as missing and is dropped; the caller tombstones it.
    ``sweep`` collects every expired entry, with those read from the log already expired.
    An expiry tombstone names the expiry it removes and spares a newer value of the key.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self._pending: dict[str, str] = {}  # key -> token of our newest write not yet read back
        self._expired_unswept: dict[str, int] = {}  # read already expired, no tombstone seen
        self._writer_id = uuid.uuid4().hex
        self._seq = 0

    def __len__(self) -> int:
        """Entries held now, expired ones not yet swept included."""
        with self._lock:
            return len(self._entries)

    def lookup(self, key: str) -> tuple[Any | None, int | None]:
        """``(copy of the value, None)`` on a hit, ``(None, None)`` when missing.

        ``(None, exp)`` when the entry had expired: it is dropped now, and the caller owes
        the topic a tombstone removing ``exp``.
        """
        now = now_ms()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                # Read back from the log already expired: the tombstone is owed now.
                owed = self._expired_unswept.pop(key, None)
                return None, owed
            value, exp = entry
            if exp <= now:
                del self._entries[key]
        if exp <= now:
            return None, exp
        return copy.deepcopy(value), None

    def begin_write(self, key: str, entry: Entry | None) -> str:
        """Apply our own write (``None``: a delete) locally; the token its record carries."""
        with self._lock:
            self._seq += 1
            token = f"{self._writer_id}:{self._seq}"
            self._pending[key] = token
            self._expired_unswept.pop(key, None)
            if entry is None:
                self._entries.pop(key, None)
            else:
                self._entries[key] = entry
        return token

    def forget_write(self, key: str, token: str) -> None:
        """A write that did not reach the log must not linger in the local table."""
        with self._lock:
            if self._pending.get(key) == token:
                del self._pending[key]
                self._entries.pop(key, None)

    def apply(self, key: str, entry: Entry | None, headers: Mapping[str, str]) -> None:
        """Apply one record read from the log (``entry`` ``None``: a tombstone)."""
        writer = headers.get(WRITER_HEADER)
        now = now_ms()
        with self._lock:
            mine = self._pending.get(key)
            if mine is not None:
                if writer != mine:
                    return  # precedes our own newer write in the log
                del self._pending[key]
            self._expired_unswept.pop(key, None)
            if entry is None:
                removes = _expiry_removed(headers)
                current = self._entries.get(key)
                if removes is None or current is None or current[1] <= removes:
                    self._entries.pop(key, None)
            elif entry[1] <= now:
                self._entries.pop(key, None)
                self._expired_unswept[key] = entry[1]
            else:
                self._entries[key] = entry

    def sweep(self) -> dict[str, int]:
        """Drop expired entries; every key owed a tombstone, with the expiry it removes."""
        now = now_ms()
        with self._lock:
            expired = {k: exp for k, (_, exp) in self._entries.items() if exp <= now}
            for key in expired:
                del self._entries[key]
            expired.update(self._expired_unswept)
            self._expired_unswept.clear()
        return expired
