"""An object store from the one-line setting users give (``PYRULA_OBJECT_STORE``,
``--object-store``, ``object_store=``).

``file:///var/lib/pyrula/objects`` (or a plain path) is a local directory;
``s3://bucket/prefix`` is S3-compatible storage (``objects/s3.py``; its endpoint and
credentials come from the environment as boto3 reads them).
"""

from __future__ import annotations

import importlib
import os
from typing import Any, cast
from urllib.parse import urlparse

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.objects.local import LocalObjectStore
from pyrula_stream.objects.resolver import PayloadStores, has_refs
from pyrula_stream.objects.store import ObjectStore

OBJECT_STORE_ENV = "PYRULA_OBJECT_STORE"
"""The setting every process reads when none is given (as ``PYRULA_KAFKA_CONFIG``)."""


def store_from_environment(setting: str | ObjectStore | None) -> ObjectStore | None:
    """The store ``setting`` names, else the one ``PYRULA_OBJECT_STORE`` names, else
    ``None`` (no store: payloads by reference are off)."""
    if setting is None:
        setting = os.environ.get(OBJECT_STORE_ENV) or None
    return None if setting is None else open_store(setting)


def default_payloads(payloads: PayloadStores | None) -> PayloadStores:
    """``payloads``, else a resolver of ``PYRULA_OBJECT_STORE``'s store (empty without
    one: a reference then raises ``PayloadUnresolved`` naming its store)."""
    if payloads is not None:
        return payloads
    store = store_from_environment(None)
    return PayloadStores([store] if store is not None else [])


def open_store(setting: str | ObjectStore) -> ObjectStore:
    """The store a setting names (a store passed in is returned as is)."""
    if not isinstance(setting, str):
        return setting
    text = setting.strip()
    if not text:
        raise ConfigurationError("object store: empty setting")
    url = urlparse(text)
    if url.scheme in ("", "file"):
        path = url.path if url.scheme == "file" else text
        if not path:
            raise ConfigurationError(f"object store {setting!r}: no directory")
        return LocalObjectStore(path)
    if url.scheme == "s3":
        try:
            module: Any = importlib.import_module("pyrula_stream.objects.s3")
        except ImportError as exc:
            raise ConfigurationError(
                f"object store {setting!r} needs the S3 store: pip install "
                f"'pyrula-stream[s3]' ({exc})"
            ) from None
        return cast(ObjectStore, module.store_from_url(text))
    raise ConfigurationError(
        f"object store {setting!r}: unknown scheme {url.scheme!r} (file:// or s3://)"
    )


def resolved_result(result: Any) -> Any:
    """A decoded turn result's value with its references read back through
    ``PYRULA_OBJECT_STORE``'s store (a pipeline's deserializer: blocking)."""
    return default_payloads(None).resolve(result) if has_refs(result) else result
