"""The shared tool cache's reader skips and counts a record it cannot read (a JSON
string of brackets once raised ``ValueError`` from the depth scan) and keeps following."""

from __future__ import annotations

import json

from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.kafka.stores.cache import KafkaCacheStore
from pyrula_stream.testing import unique_name, wait_for


async def test_the_cache_reader_skips_and_counts_unreadable_records(
    kafka_bootstrap_servers: str,
) -> None:
    prefix = unique_name("c")
    producer = RecordProducer(kafka_bootstrap_servers)
    try:
        async with KafkaCacheStore(kafka_bootstrap_servers, prefix=prefix) as store:
            for value in (
                json.dumps("[" * 300).encode(),
                b"[" * 100_000 + b"]" * 100_000,
                json.dumps({"v": 1, "exp": "soon"}).encode(),
            ):
                await producer.send(store.topic, b"bad", value)
            await store.set("good", {"v": "[" * 300}, 60)
            # A second store reads the topic from its start, as a new worker would.
            async with KafkaCacheStore(kafka_bootstrap_servers, prefix=prefix) as other:
                await wait_for(lambda: other.skipped_records == 3, 30, "three skipped")
                assert await other.get("good") == {"v": "[" * 300}
                assert await other.get("bad") is None
    finally:
        producer.close()
