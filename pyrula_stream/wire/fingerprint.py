"""The fingerprint of a step's input: how replay knows that a durable call asks what it
asked when it was recorded (``replay_input_changed`` when it does not).

The bytes hashed are canonical JSON (sorted keys, compact); they must never change, or
journals written before stop replaying.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
)
"""What ``fingerprint`` hashes: ``json.dumps`` with these options (one encoder, not one
per call); the bytes must never change, or journals written before stop replaying."""


def fingerprint(value: Any) -> str:
    """A short, stable hash of a JSON-able value (sorted keys, compact)."""
    raw = _CANONICAL.encode(value)
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


class RunningFingerprint:
    """``fingerprint(items)`` of a list that grows between calls, each item encoded once.

    A tool loop hashes its whole conversation before every model call; re-encoding it made
    a turn's CPU grow with the square of its length. The canonical JSON of a list is ``[``,
    the items' encodings joined by ``,``, then ``]``, so a running hash over those bytes
    gives the same fingerprint as ``fingerprint`` (journals recorded either way replay).

    The items already hashed are taken as they were when hashed: the list passed next must
    be the last one grown at its end (a tool loop's conversation, copied or not). One that
    is shorter, or whose first or last hashed item is another object, starts the hash
    over. Checking those two, not every item, keeps a call's cost independent of the
    conversation's length, and holds no reference to the items.
    """

    __slots__ = ("_count", "_first", "_hash", "_last")

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(b"[", digest_size=8)
        self._count = 0
        self._first: Any = None
        self._last: Any = None

    def of(self, items: list[Any]) -> str:
        """The fingerprint of ``items``; only the items after the last call's are encoded."""
        count = self._count
        if count and (
            len(items) < count or items[0] is not self._first or items[count - 1] is not self._last
        ):
            self._hash = hashlib.blake2b(b"[", digest_size=8)
            count = self._count = 0
        for item in items[count:]:
            raw = _CANONICAL.encode(item).encode()  # first, so a failure leaves no half
            self._hash.update(b"," + raw if self._count else raw)
            if not self._count:
                self._first = item
            self._last = item
            self._count += 1
        whole = self._hash.copy()
        whole.update(b"]")
        return whole.hexdigest()
