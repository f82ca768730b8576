"""Agent memory, the store: ``MemoryItem``, the ``MemoryBackend`` protocol, its SQLite view.

Memory is shared by every agent and worker: one compacted topic ``<prefix>.memory`` keyed
by namespace and key (``pyrula_stream.kafka.stores.memory.KafkaMemory`` reads it whole into
a ``SqliteMemory`` on every worker, with an FTS5 index for ``search``). What a turn calls,
``ctx.memory``, is ``pyrula_stream.context.memory_calls.AgentMemory``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, cast, runtime_checkable

from pyrula_stream.errors import MalformedRecordError, PayloadTooLarge, UserError
from pyrula_stream.wire import guard

__all__ = [
    "DEFAULT_MAX_MEMORY_VALUE_BYTES",
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
        with guard.guarded(what):
            return cls(
                namespace=tuple(namespace),
                key=key,
                value=value,
                source=cast(MemorySource, source),
                written_by_run_id=guard.text_field(raw, "written_by_run_id", what),
                updated_ms=guard.int_field(raw, "updated_ms", what),
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
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        # Only this account reads it (sqlite would take the umask): what turns hold.
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
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
