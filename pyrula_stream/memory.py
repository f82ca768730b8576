"""Agent memory: the ``MemoryBackend`` protocol, its local SQLite view, and ``ctx.memory``.

Memory is shared by every agent and worker: one compacted topic ``<prefix>.memory`` keyed
by namespace and key (``pyrula_stream.kafka.memory_store.KafkaMemory`` reads it whole into
a ``SqliteMemory`` on every worker, with an FTS5 index for ``search``).

``ctx.memory`` (``AgentMemory``) makes every call durable: a ``put``/``delete`` is a
journaled step whose memory record rides the turn's transaction (a replay never writes it
again, a crash before the commit writes nothing); a ``get``/``list``/``search`` journals
what it read, so a replay sees the same value. A turn reads its own writes at once; other
workers see them once their reader has caught up (eventual, typically milliseconds).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, runtime_checkable

from pyrula_stream import wire_guard
from pyrula_stream.errors import MalformedRecordError, PayloadTooLarge, UserError
from pyrula_stream.records import OutRecord
from pyrula_stream.runtime.journal import fingerprint

if TYPE_CHECKING:
    from pyrula_stream.runtime.turn import StepData, TurnRuntime

__all__ = [
    "DEFAULT_MAX_MEMORY_VALUE_BYTES",
    "AgentMemory",
    "MemoryBackend",
    "MemoryItem",
    "MemoryItems",
    "MemorySource",
    "SqliteMemory",
]

MemorySource = Literal["agent", "user", "system"]
DEFAULT_MAX_MEMORY_VALUE_BYTES = 256 * 1024
_SEP = "\x1f"  # joins namespace parts in the local view; refused inside a part


@dataclass(frozen=True, slots=True)
class MemoryItem:
    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    source: MemorySource = "agent"
    written_by_run_id: str | None = None
    updated_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "namespace": list(self.namespace)}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> MemoryItem:
        """An item from its JSON object; a missing or mistyped field is malformed."""
        what = "memory item"
        namespace, key, value = raw.get("namespace"), raw.get("key"), raw.get("value")
        if not isinstance(namespace, list) or not all(isinstance(p, str) for p in namespace):
            raise MalformedRecordError(f"{what}: field 'namespace' must be a list of text")
        if not isinstance(key, str):
            raise MalformedRecordError(f"{what}: field 'key' must be text")
        if not isinstance(value, dict):
            raise MalformedRecordError(f"{what}: field 'value' must be an object")
        source = raw.get("source", "agent")
        if source not in ("agent", "user", "system"):
            raise MalformedRecordError(f"{what}: field 'source' must be agent, user or system")
        with wire_guard.guarded(what):
            return cls(
                namespace=tuple(namespace),
                key=key,
                value=value,
                source=cast(MemorySource, source),
                written_by_run_id=wire_guard.text_field(raw, "written_by_run_id", what),
                updated_ms=wire_guard.int_field(raw, "updated_ms", what),
            )


MemoryItems = list[MemoryItem]


@runtime_checkable
class MemoryBackend(Protocol):
    """A pluggable memory store (synchronous; ``ctx.memory`` runs it in a thread).
    ``list``/``search`` take a namespace prefix."""

    def put(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: dict[str, Any],
        *,
        source: MemorySource,
        written_by_run_id: str | None,
    ) -> None: ...

    def get(self, namespace: tuple[str, ...], key: str) -> MemoryItem | None: ...

    def delete(self, namespace: tuple[str, ...], key: str) -> None: ...

    def list(
        self, namespace_prefix: tuple[str, ...], *, key_prefix: str = "", limit: int = 100
    ) -> MemoryItems: ...

    def search(
        self, namespace_prefix: tuple[str, ...], query: str, *, limit: int = 10
    ) -> MemoryItems: ...


def check_namespace(namespace: tuple[str, ...], key: str | None = None) -> tuple[str, ...]:
    if not isinstance(namespace, tuple) or not all(
        isinstance(p, str) and p and _SEP not in p for p in namespace
    ):
        raise UserError(
            f"memory namespace {namespace!r} must be a tuple of non-empty strings, e.g. "
            '("users", "u-42")'
        )
    if key is not None and (not isinstance(key, str) or not key):
        raise UserError(f"memory key {key!r} must be a non-empty string")
    return namespace


def record_key(namespace: tuple[str, ...], key: str) -> str:
    """The Kafka key of an item: namespace and key as JSON (unambiguous, readable)."""
    return json.dumps([list(namespace), key], separators=(",", ":"))


def encode_item(item: MemoryItem, max_bytes: int) -> bytes:
    """The record value; ``PayloadTooLarge`` naming the key and the limit past ``max_bytes``."""
    value = json.dumps(item.to_json(), separators=(",", ":")).encode()
    if len(value) > max_bytes:
        raise PayloadTooLarge(
            f"memory value for {item.namespace!r} key {item.key!r} is {len(value)} bytes, over "
            f"the {max_bytes}-byte limit: store a smaller value (or a reference to it)"
        )
    return value


def _fts_query(query: str) -> str:
    """Each word as a quoted FTS5 term (any word matches), so user text is never syntax."""
    words = [w.replace('"', '""') for w in query.split()]
    return " OR ".join(f'"{w}"' for w in words)


class SqliteMemory:
    """The local view of the memory topic: one SQLite file, an FTS5 index for ``search``.

    Rebuilt from the topic at every start (no fsync). Written by the topic's follower
    thread, read by the event loop's threads: one lock serializes them.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.executescript(
            """
            PRAGMA journal_mode = OFF;
            PRAGMA synchronous = OFF;
            CREATE TABLE items (
                id INTEGER PRIMARY KEY, ns TEXT NOT NULL, key TEXT NOT NULL,
                item TEXT NOT NULL, UNIQUE (ns, key)
            );
            CREATE VIRTUAL TABLE items_text USING fts5(body);
            """
        )

    def apply(self, namespace: tuple[str, ...], key: str, item: MemoryItem | None) -> None:
        """One committed write (``None``: a tombstone)."""
        ns = _SEP.join(namespace)
        with self._lock:
            row = self._db.execute(
                "SELECT id FROM items WHERE ns = ? AND key = ?", (ns, key)
            ).fetchone()
            if row is not None:
                self._db.execute("DELETE FROM items WHERE id = ?", (row[0],))
                self._db.execute("DELETE FROM items_text WHERE rowid = ?", (row[0],))
            if item is None:
                return
            cur = self._db.execute(
                "INSERT INTO items (ns, key, item) VALUES (?, ?, ?)",
                (ns, key, json.dumps(item.to_json())),
            )
            body = f"{key} {json.dumps(item.value, ensure_ascii=False)}"
            self._db.execute(
                "INSERT INTO items_text (rowid, body) VALUES (?, ?)", (cur.lastrowid, body)
            )

    def get(self, namespace: tuple[str, ...], key: str) -> MemoryItem | None:
        with self._lock:
            row = self._db.execute(
                "SELECT item FROM items WHERE ns = ? AND key = ?", (_SEP.join(namespace), key)
            ).fetchone()
        return None if row is None else MemoryItem.from_json(json.loads(row[0]))

    def list(
        self, namespace_prefix: tuple[str, ...], *, key_prefix: str = "", limit: int = 100
    ) -> MemoryItems:
        ns = _SEP.join(namespace_prefix)
        with self._lock:
            rows = self._db.execute(
                "SELECT item FROM items WHERE (ns = ? OR substr(ns, 1, ?) = ? OR ? = '') "
                "AND substr(key, 1, ?) = ? ORDER BY ns, key LIMIT ?",
                (ns, len(ns) + 1, ns + _SEP, ns, len(key_prefix), key_prefix, limit),
            ).fetchall()
        return [MemoryItem.from_json(json.loads(r[0])) for r in rows]

    def search(
        self, namespace_prefix: tuple[str, ...], query: str, *, limit: int = 10
    ) -> MemoryItems:
        match = _fts_query(query)
        if not match:
            return []
        ns = _SEP.join(namespace_prefix)
        with self._lock:
            rows = self._db.execute(
                "SELECT items.item FROM items_text JOIN items ON items.id = items_text.rowid "
                "WHERE items_text MATCH ? AND (items.ns = ? OR substr(items.ns, 1, ?) = ? "
                "OR ? = '') ORDER BY bm25(items_text) LIMIT ?",
                (match, ns, len(ns) + 1, ns + _SEP, ns, limit),
            ).fetchall()
        return [MemoryItem.from_json(json.loads(r[0])) for r in rows]

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM items").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
        self.path.unlink(missing_ok=True)


RecordFor = Callable[[tuple[str, ...], str, MemoryItem | None], OutRecord]


class AgentMemory:
    """``ctx.memory``: the worker's ``MemoryBackend``, every call a journaled step.

    With ``record_for`` (the Kafka store) a write is a record in the turn's transaction;
    without it (a plugged-in backend) the write runs once as the step's live part.
    """

    def __init__(
        self,
        turn: TurnRuntime,
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
        data, _ = await self._turn.durable_step("memory", name, fingerprint(query), live)
        return data

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
            return [self._record_for(namespace, key, written)]

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
