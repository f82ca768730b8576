"""A value stored outside the record: the small reference that takes its place.

A value the runtime writes over a size threshold is put in an object store under its
content address and replaced, wherever it sat in the record's JSON, by
``{"$pyrula_ref": {"store": ..., "key": ..., "size": ..., "sha256": ...,
"content_type": ...}}``. Any reader (ours, or another language's through the JSON Schema)
fetches ``key`` from the store named ``store`` and checks size and hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyrula_stream.errors import MalformedRecordError

REF_FIELD = "$pyrula_ref"
"""The one key of the JSON object that stands for a stored value."""


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
        raise MalformedRecordError(f"payload reference {ref.key}: size or hash differs")
