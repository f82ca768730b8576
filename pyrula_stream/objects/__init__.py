"""Object stores (floor 3): where values too big for a Kafka record live, referenced from
records.

``store.ObjectStore`` is what the runtime, clients and faces need of a store; a local
directory (one machine, tests) and S3-compatible storage implement it.
"""

from pyrula_stream.objects.store import ObjectInfo, ObjectStore

__all__ = ["ObjectInfo", "ObjectStore"]
