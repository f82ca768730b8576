"""Object stores (floor 3): where values too big for a Kafka record live, referenced from
records.

``store.ObjectStore`` is what the runtime, clients and faces need of a store; a local
directory (``local.LocalObjectStore``: one machine, tests) and S3-compatible storage
implement it. ``resolver.PayloadStores`` is the one resolver every reader uses;
``urls.open_store`` builds a store from its setting.
"""

from pyrula_stream.objects.local import LocalObjectStore
from pyrula_stream.objects.resolver import PayloadStores, has_refs
from pyrula_stream.objects.store import ObjectInfo, ObjectStore
from pyrula_stream.objects.urls import open_store

__all__ = [
    "LocalObjectStore",
    "ObjectInfo",
    "ObjectStore",
    "PayloadStores",
    "has_refs",
    "open_store",
]
