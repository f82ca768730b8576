"""A value stored outside the record: the small reference that takes its place.

A value the runtime writes over a size threshold is put in an object store under its
content address and replaced, wherever it sat in the record's JSON, by
``{"$pyrula_ref": {"store": ..., "key": ..., "size": ..., "sha256": ...,
"content_type": ...}}``. Any reader (ours, or another language's through the JSON Schema)
fetches ``key`` from the store named ``store`` and checks size and hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyrula_stream.errors import MalformedRecordError, PayloadTooLarge
from pyrula_stream.wire import serde

REF_FIELD = "$pyrula_ref"
"""The one key of the JSON object that stands for a stored value."""

REF_MARK = b'"$pyrula_ref"'
"""``REF_FIELD`` as it appears in JSON bytes: a record without it holds no reference, so
a reader (the sweeper, a resolver) skips the walk."""

DEFAULT_THRESHOLD = 256 * 1024
"""A value whose JSON is past this many bytes is stored by reference (well under a
record's 1 MiB, as Temporal's external storage offloads above 256 KiB)."""


@dataclass(frozen=True, slots=True)
class PayloadRef:
    """Where a stored value is and how to check it."""

    store: str
    key: str
    size: int
    sha256: str
    content_type: str = "application/json"

    def data(self) -> dict[str, Any]:
        """The reference as it sits in a record's JSON."""
        return {
            REF_FIELD: {
                "store": self.store,
                "key": self.key,
                "size": self.size,
                "sha256": self.sha256,
                "content_type": self.content_type,
            }
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> PayloadRef:
        """The reference of ``{"$pyrula_ref": {...}}``; anything else is malformed."""
        body = data.get(REF_FIELD)
        if not isinstance(body, Mapping):
            raise MalformedRecordError(f"payload reference: {REF_FIELD!r} must be an object")
        try:
            ref = cls(
                store=str(body["store"]),
                key=str(body["key"]),
                size=int(body["size"]),
                sha256=str(body["sha256"]),
                content_type=str(body.get("content_type", "application/json")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedRecordError(f"payload reference: {exc}") from None
        if not ref.key or ref.size < 0 or len(ref.sha256) != 64:
            raise MalformedRecordError("payload reference: empty key, bad size or bad sha256")
        return ref


def is_ref(value: Any) -> bool:
    """Whether a decoded JSON value is a payload reference."""
    return isinstance(value, Mapping) and len(value) == 1 and REF_FIELD in value


def content_key(data: bytes, prefix: str = "") -> tuple[str, str]:
    """The content address of ``data``: ``(key, sha256 hex)``. The same bytes always get
    the same key, so a rerun after a crash overwrites nothing new."""
    digest = hashlib.sha256(data).hexdigest()
    return f"{prefix}{digest[:2]}/{digest}", digest


def check(ref: PayloadRef, data: bytes) -> None:
    """Raise ``MalformedRecordError`` when fetched bytes are not the referenced ones."""
    if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
        raise MalformedRecordError(
            f"payload reference {ref.key} in store {ref.store!r}: the object is "
            f"{len(data)} bytes, the reference says {ref.size}, or its sha256 differs"
        )


@dataclass(frozen=True, slots=True)
class StoredValue:
    """A value taken out of a record: its reference and the bytes to put under its key
    before the transaction that carries the reference commits."""

    ref: PayloadRef
    data: bytes


@dataclass(frozen=True, slots=True)
class Offload:
    """Which values leave their record and where they go: the worker's (and client's)
    one rule, applied where records are built.

    ``store``: the name the references carry; ``threshold``: a value whose JSON is past
    it is stored; ``max_bytes``: a value past it is refused with ``PayloadTooLarge``
    naming the limit (``None``: no limit)."""

    store: str
    threshold: int = DEFAULT_THRESHOLD
    max_bytes: int | None = None
    prefix: str = ""

    def apply(
        self, value: Any, what: str, encoded: bytes | None = None
    ) -> tuple[Any, list[StoredValue]]:
        """``value`` with each part too big for a record replaced by its reference, and
        the values to store. Small values come back as they are (the same object), with
        no walk. ``encoded``: ``value``'s JSON when the caller has it already."""
        data = serde.json_bytes(value) if encoded is None else encoded
        if len(data) <= self.threshold:
            return value, []
        if self.max_bytes is not None and len(data) > self.max_bytes:
            raise PayloadTooLarge(
                f"{what} is {len(data)} bytes, over the agent's max_payload_bytes="
                f"{self.max_bytes}: shrink it or raise max_payload_bytes",
                detail={"bytes": len(data), "max_payload_bytes": self.max_bytes},
            )
        out: list[StoredValue] = []
        return self._walk(value, data, out), out

    def _walk(self, value: Any, data: bytes, out: list[StoredValue]) -> Any:
        """Replace the big parts of ``value`` (whose JSON is ``data``): a container's big
        children one by one, then the container itself if it is still too big."""
        if len(data) <= self.threshold or is_ref(value):
            return value
        if isinstance(value, dict | list) and value:
            items = value.items() if isinstance(value, dict) else enumerate(value)
            changed = {k: self._walk(v, serde.json_bytes(v), out) for k, v in items}
            smaller: Any = changed if isinstance(value, dict) else list(changed.values())
            data = serde.json_bytes(smaller)
            if len(data) <= self.threshold:
                return smaller
            value = smaller
        stored = self.store_bytes(data)
        out.append(stored)
        return stored.ref.data()

    def store_bytes(self, data: bytes, content_type: str = "application/json") -> StoredValue:
        """``data`` under its content address in this store."""
        key, digest = content_key(data, self.prefix)
        return StoredValue(PayloadRef(self.store, key, len(data), digest, content_type), data)


def refs_in(value: Any) -> Iterator[PayloadRef]:
    """Every reference in a decoded JSON value (a malformed one raises
    ``MalformedRecordError``)."""
    if isinstance(value, dict):
        if is_ref(value):
            yield PayloadRef.from_data(value)
            return
        for v in value.values():
            yield from refs_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from refs_in(v)


def replace_refs(value: Any, fetch: Callable[[PayloadRef], Any]) -> Any:
    """``value`` with each reference replaced by ``fetch(ref)`` (the stored value, itself
    walked again: a stored container may hold references of its parts). A value without
    references comes back as the same object."""
    if isinstance(value, dict):
        if is_ref(value):
            return replace_refs(fetch(PayloadRef.from_data(value)), fetch)
        out: dict[str, Any] | None = None
        for k, v in value.items():
            new = replace_refs(v, fetch)
            if new is not v:
                if out is None:
                    out = dict(value)
                out[k] = new
        return value if out is None else out
    if isinstance(value, list):
        items = [replace_refs(v, fetch) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value
