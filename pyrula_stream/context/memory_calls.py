"""``ctx.memory`` (``AgentMemory``): memory calls that are durable steps of the turn.

A ``put``/``delete`` is a journaled step whose memory record rides the turn's transaction
(a replay never writes it again, a crash before the commit writes nothing); a
``get``/``list``/``search`` journals what it read, so a replay sees the same value. A turn
reads its own writes at once; other workers see them once their reader has caught up
(eventual, typically milliseconds). The store behind it is ``pyrula_stream.state.memory``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyrula_stream.errors import UserError
from pyrula_stream.state.memory import (
    DEFAULT_MAX_MEMORY_VALUE_BYTES,
    MemoryBackend,
    MemoryItem,
    MemoryItems,
    MemorySource,
    check_namespace,
    encode_item,
)
from pyrula_stream.wire.fingerprint import fingerprint
from pyrula_stream.wire.payload_refs import StoredValue
from pyrula_stream.wire.records import OutRecord

if TYPE_CHECKING:
    from pyrula_stream.durable.steps import DurableSteps, StepData

__all__ = ["AgentMemory", "RecordFor"]

RecordFor = Callable[[tuple[str, ...], str, MemoryItem | None], OutRecord]


class AgentMemory:
    """``ctx.memory``: the worker's ``MemoryBackend``, every call a journaled step.

    With ``record_for`` (the Kafka store) a write is a record in the turn's transaction;
    without it (a plugged-in backend) the write runs once as the step's live part.
    """

    __slots__ = (
        "_backend",
        "_max_value_bytes",
        "_record_for",
        "_turn",
        "_written",
    )  # one per turn in flight

    def __init__(
        self,
        turn: DurableSteps,
        backend: MemoryBackend,
        *,
        record_for: RecordFor | None = None,
        max_value_bytes: int = DEFAULT_MAX_MEMORY_VALUE_BYTES,
    ) -> None:
        self._turn = turn
        self._backend = backend
        self._record_for = record_for
        self._max_value_bytes = max_value_bytes
        self._written: dict[tuple[tuple[str, ...], str], MemoryItem | None] = {}

    async def put(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: dict[str, Any],
        *,
        source: MemorySource = "agent",
        written_by_run_id: str | None = None,
    ) -> None:
        check_namespace(namespace, key)
        if not isinstance(value, dict):
            raise UserError(f"memory value for key {key!r} must be a JSON object (a dict)")
        item = MemoryItem(namespace, key, value, source, written_by_run_id or self._turn.turn_id, 0)
        if self._record_for is None or self._turn.offload is None:  # else: by reference
            encode_item(item, self._max_value_bytes)  # fails fast, naming key and limit
        await self._write("put", namespace, key, item)

    async def delete(self, namespace: tuple[str, ...], key: str) -> None:
        check_namespace(namespace, key)
        await self._write("delete", namespace, key, None)

    async def get(self, namespace: tuple[str, ...], key: str) -> MemoryItem | None:
        check_namespace(namespace, key)

        async def live() -> StepData:
            if (namespace, key) in self._written:
                found = self._written[(namespace, key)]
            else:
                found = await asyncio.to_thread(self._backend.get, namespace, key)
            return {"item": None if found is None else found.to_json()}

        data = await self._read("get", [list(namespace), key], live)
        return None if data["item"] is None else MemoryItem.from_json(data["item"])

    async def list(
        self, namespace_prefix: tuple[str, ...], *, key_prefix: str = "", limit: int = 100
    ) -> MemoryItems:
        check_namespace(namespace_prefix)

        async def live() -> StepData:
            found = await asyncio.to_thread(
                self._backend.list, namespace_prefix, key_prefix=key_prefix, limit=limit
            )
            items = self._merge(found, namespace_prefix, lambda i: i.key.startswith(key_prefix))
            items.sort(key=lambda i: (i.namespace, i.key))
            return {"items": [i.to_json() for i in items[:limit]]}

        data = await self._read("list", [list(namespace_prefix), key_prefix, limit], live)
        return [MemoryItem.from_json(i) for i in data["items"]]

    async def search(
        self, namespace_prefix: tuple[str, ...], query: str, *, limit: int = 10
    ) -> MemoryItems:
        check_namespace(namespace_prefix)
        words = [w.lower() for w in query.split()]

        def matches(item: MemoryItem) -> bool:
            text = f"{item.key} {json.dumps(item.value, ensure_ascii=False)}".lower()
            return any(w in text for w in words)

        async def live() -> StepData:
            found = await asyncio.to_thread(
                self._backend.search, namespace_prefix, query, limit=limit
            )
            items = self._merge(found, namespace_prefix, matches)
            return {"items": [i.to_json() for i in items[:limit]]}

        data = await self._read("search", [list(namespace_prefix), query, limit], live)
        return [MemoryItem.from_json(i) for i in data["items"]]

    # -- internals ------------------------------------------------------------------------

    def _merge(
        self,
        found: MemoryItems,
        prefix: tuple[str, ...],
        keep: Callable[[MemoryItem], bool],
    ) -> MemoryItems:
        """The backend's answer with this turn's own writes laid over it."""
        items = [i for i in found if (i.namespace, i.key) not in self._written]
        for (ns, _), item in self._written.items():
            if item is not None and ns[: len(prefix)] == prefix and keep(item):
                items.append(item)
        return items

    async def _read(
        self, name: str, query: Sequence[Any], live: Callable[[], Any]
    ) -> dict[str, Any]:
        """The read's recorded data, large values read back (the store holds a value past
        the offload threshold by reference)."""
        data, _ = await self._turn.durable_step("memory", name, fingerprint(query), live)
        return dict(await self._turn.resolved(data))

    async def _write(
        self, name: str, namespace: tuple[str, ...], key: str, item: MemoryItem | None
    ) -> None:
        turn = self._turn
        what = f"ctx.memory.{name}"

        async def live() -> StepData:
            if turn.branch is not None:  # a branch never writes to shared memory
                raise turn.refuse(turn.branch.refuse_effect(what))
            stamped = None if item is None else _stamped(item)
            if self._record_for is None:  # a plugged-in backend: written once, here
                if stamped is None:
                    await asyncio.to_thread(self._backend.delete, namespace, key)
                else:
                    await asyncio.to_thread(
                        self._backend.put,
                        namespace,
                        key,
                        stamped.value,
                        source=stamped.source,
                        written_by_run_id=stamped.written_by_run_id,
                    )
            return {"item": None if stamped is None else stamped.to_json()}

        def records(data: StepData) -> list[OutRecord]:
            if self._record_for is None:
                return []
            written = None if data["item"] is None else MemoryItem.from_json(data["item"])
            stored: list[StoredValue] = []
            if written is not None and turn.offload is not None:  # a large value: by reference
                value, stored = turn.offload.apply(written.value, f"{what} of {key!r}")
                written = replace(written, value=value)
            record = self._record_for(namespace, key, written)
            record.objects = tuple(stored)
            return [record]

        query = [list(namespace), key, None if item is None else item.to_json()]
        data, _ = await turn.durable_step("memory", name, fingerprint(query), live, effects=records)
        self._written[(namespace, key)] = (
            None if data["item"] is None else MemoryItem.from_json(data["item"])
        )


def _stamped(item: MemoryItem) -> MemoryItem:
    return MemoryItem(
        item.namespace,
        item.key,
        item.value,
        item.source,
        item.written_by_run_id,
        int(time.time() * 1000),
    )
