"""Kafka's default (murmur2) partitioner, so a reader can find the partition of a key.

Our producers use librdkafka's ``murmur2_random`` partitioner, which matches the Java
client: a turn's events live in ``murmur2(turn_id) % partitions`` for every language.
"""

from __future__ import annotations

PARTITIONER = "murmur2_random"


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (32-bit, seed 0x9747b28c), as ``Utils.murmur2`` computes it."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = (
            (data[i4] & 0xFF)
            | ((data[i4 + 1] & 0xFF) << 8)
            | ((data[i4 + 2] & 0xFF) << 16)
            | ((data[i4 + 3] & 0xFF) << 24)
        )
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = length4 * 4
    if rest == 3:
        h ^= (data[tail + 2] & 0xFF) << 16
    if rest >= 2:
        h ^= (data[tail + 1] & 0xFF) << 8
    if rest >= 1:
        h ^= data[tail] & 0xFF
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
