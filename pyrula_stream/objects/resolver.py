"""The one resolver: payload references back into the values they stand for.

Every reader that uses the project (the worker at restore and replay, the client, the
gateway, the UI, replay and branch) holds a ``PayloadStores``, the stores it can read by
name, and passes what it decoded through ``resolve``. A reference whose store is not
configured, whose object is gone, or whose bytes differ from its size and hash raises
``PayloadUnresolved`` naming the store and the key: never a silent empty value.
The worker's committer also puts through it (``put``), so bytes stored are counted once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from typing import Any

from pyrula_stream.errors import MalformedRecordError, PayloadUnresolved
from pyrula_stream.objects.store import ObjectStore
from pyrula_stream.wire.payload_refs import (
    REF_FIELD,
    PayloadRef,
    StoredValue,
    check,
    replace_refs,
)


class PayloadStores:
    """Object stores by the name references carry (``ObjectStore.name``)."""

    def __init__(
        self,
        stores: Iterable[ObjectStore] = (),
        *,
        on_resolved: Callable[[int, int], None] | None = None,
    ) -> None:
        self._stores = {s.name: s for s in stores}
        self.on_resolved = on_resolved
        """Hears ``(references, bytes)`` after each ``resolve`` that read some (metrics)."""

    def __bool__(self) -> bool:
        return bool(self._stores)

    def __repr__(self) -> str:
        return f"PayloadStores({sorted(self._stores)})"

    @property
    def names(self) -> list[str]:
        return sorted(self._stores)

    def store(self, name: str) -> ObjectStore:
        found = self._stores.get(name)
        if found is None:
            raise PayloadUnresolved(
                f"a payload reference names object store {name!r}, which this reader "
                f"does not have (it has {self.names or 'none'}): configure it "
                "(PYRULA_OBJECT_STORE, --object-store, object_store=)"
            )
        return found

    def fetch(self, ref: PayloadRef) -> Any:
        """The value ``ref`` stands for, checked against its size and hash."""
        try:
            store = self.store(ref.store)
        except PayloadUnresolved as exc:
            raise PayloadUnresolved(
                f"payload reference {ref.key}: {exc}", detail={"store": ref.store, "key": ref.key}
            ) from None
        try:
            data = store.get(ref.key)
        except KeyError:
            raise PayloadUnresolved(
                f"payload reference {ref.key} in object store {ref.store!r}: no such "
                "object (deleted, or never written)",
                detail={"store": ref.store, "key": ref.key},
            ) from None
        try:
            check(ref, data)
        except MalformedRecordError as exc:
            raise PayloadUnresolved(str(exc), detail={"store": ref.store, "key": ref.key}) from None
        if ref.content_type.startswith("application/json"):
            return json.loads(data)
        if ref.content_type.startswith("text/"):
            return data.decode("utf-8", "replace")
        return data

    def resolve(self, value: Any) -> Any:
        """``value`` with every reference replaced by its value (the same object when it
        holds none)."""
        if not has_refs(value):
            return value
        out, count, size = self._resolve_counted(value)
        if self.on_resolved is not None:
            self.on_resolved(count, size)
        return out

    async def resolve_async(self, value: Any) -> Any:
        """``resolve`` off the event loop (reads block), when there is anything to read;
        ``on_resolved`` hears of it on the loop."""
        if not has_refs(value):
            return value
        out, count, size = await asyncio.to_thread(self._resolve_counted, value)
        if self.on_resolved is not None:
            self.on_resolved(count, size)
        return out

    def _resolve_counted(self, value: Any) -> tuple[Any, int, int]:
        counted = [0, 0]

        def fetch(ref: PayloadRef) -> Any:
            counted[0] += 1
            counted[1] += ref.size
            return self.fetch(ref)

        return replace_refs(value, fetch), counted[0], counted[1]

    def put(self, values: Iterable[StoredValue]) -> int:
        """Store each value under its key (once per key); the bytes written."""
        written = 0
        seen: set[tuple[str, str]] = set()
        for v in values:
            where = (v.ref.store, v.ref.key)
            if where in seen:
                continue
            seen.add(where)
            self.store(v.ref.store).put(v.ref.key, v.data, v.ref.content_type)
            written += len(v.data)
        return written


def has_refs(value: Any) -> bool:
    """Whether a decoded JSON value holds a reference anywhere (a walk without copies)."""
    if isinstance(value, dict):
        if REF_FIELD in value:
            return True
        return any(has_refs(v) for v in value.values() if isinstance(v, dict | list))
    if isinstance(value, list):
        return any(has_refs(v) for v in value if isinstance(v, dict | list))
    return False
