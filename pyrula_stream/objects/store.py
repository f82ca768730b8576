"""What the project needs of an object store: put, get, delete and list by key.

Calls block (the S3 client libraries do); async code runs them off the event loop with
``asyncio.to_thread``. Keys are content addresses chosen by the caller, so a put of the
same bytes under the same key twice is harmless: that is what makes a rerun after a crash
write nothing new.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One stored object as a listing sees it (what the sweeper decides with)."""

    key: str
    size: int
    modified_ms: int


@runtime_checkable
class ObjectStore(Protocol):
    """A bucket-like store of immutable objects addressed by key."""

    @property
    def name(self) -> str:
        """The store as a reference names it (``"local"``, ``"s3"``): a reader picks the
        store that resolves a reference by this name."""
        ...

    def put(self, key: str, data: bytes, content_type: str) -> None:
        """Store ``data`` under ``key``; replacing an object with the same bytes is a no-op
        in effect."""
        ...

    def get(self, key: str) -> bytes:
        """The object's bytes; ``KeyError`` when there is none."""
        ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error (sweeps run twice)."""
        ...

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in no particular order."""
        ...
