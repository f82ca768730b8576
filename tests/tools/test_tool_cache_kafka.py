"""The shared tool cache on a compacted Kafka topic, on the real broker: what two workers see."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from pyrula_stream.errors import (
    BrokerUnavailableError,
    PayloadTooLarge,
    TopicDriftError,
    UserError,
)
from pyrula_stream.kafka.admin import TopicSpec, apply_topics
from pyrula_stream.kafka.local.broker import free_port
from pyrula_stream.kafka.stores.cache import KafkaCacheStore, cache_topic_spec
from pyrula_stream.testing import read_topic, unique_name, wait_for
from pyrula_stream.tools.cache import CacheStore, tool_cache_key
from pyrula_stream.tools.contract import ToolContext, canonical_json, tool


class WorkerRuntime:
    """A real, minimal ToolRuntime: one worker's turn, exposing that worker's cache store."""

    def __init__(self, cache_store: CacheStore, turn_id: str = "turn-1") -> None:
        self.turn_id = turn_id
        self.cache_store: CacheStore | None = cache_store
        self.statuses: list[str] = []

    def is_cancelled(self) -> bool:
        return False

    async def emit_status(self, text: str, *, tool_name: str | None) -> None:
        self.statuses.append(text)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
def prefix() -> str:
    return unique_name("cache")


@pytest.fixture
async def two_workers(
    kafka_bootstrap_servers: str, prefix: str
) -> AsyncIterator[tuple[KafkaCacheStore, KafkaCacheStore]]:
    """Two stores on one topic, as two workers of a fleet would hold them."""
    async with (
        KafkaCacheStore(kafka_bootstrap_servers, prefix=prefix) as a,
        KafkaCacheStore(kafka_bootstrap_servers, prefix=prefix) as b,
    ):
        yield a, b


async def test_a_write_in_one_worker_is_seen_by_another(
    two_workers: tuple[KafkaCacheStore, KafkaCacheStore],
) -> None:
    a, b = two_workers
    await a.set("rates", {"EUR": 1.08, "GBP": 1.27}, 60)
    assert await a.get("rates") == {"EUR": 1.08, "GBP": 1.27}  # read-your-writes, at once
    await wait_for(lambda: b.get_nowait("rates") is not None, 15, "b never saw a's write")
    assert await b.get("rates") == {"EUR": 1.08, "GBP": 1.27}

    await b.set("rates", {"EUR": 1.09}, 60)  # the later write wins everywhere
    await wait_for(lambda: a.get_nowait("rates") == {"EUR": 1.09}, 15, "a kept the old value")

    await a.set("rates", None, 60)  # None deletes for everyone
    assert await a.get("rates") is None
    await wait_for(lambda: b.get_nowait("rates") is None, 15, "the delete never reached b")


async def test_the_topic_is_compacted_and_records_carry_their_expiry(
    kafka_bootstrap_servers: str, prefix: str, two_workers: tuple[KafkaCacheStore, KafkaCacheStore]
) -> None:
    a, _ = two_workers
    spec = cache_topic_spec(prefix=prefix)
    assert a.topic == spec.name == f"{prefix}.cache"
    assert spec.config["cleanup.policy"] == "compact"
    report = await asyncio.to_thread(apply_topics, kafka_bootstrap_servers, [spec])
    assert report.ok and report.matched == [a.topic]  # created as the spec says
    await a.set("k", [1, 2], 30)
    records = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, a.topic)
    [(key, value, _)] = records
    record = json.loads(value or b"")
    assert key == b"k" and record["v"] == [1, 2]
    assert isinstance(record["exp"], int) and record["exp"] > 1_600_000_000_000


async def test_entries_expire_for_every_worker(
    two_workers: tuple[KafkaCacheStore, KafkaCacheStore],
) -> None:
    a, b = two_workers
    await a.set("short", "soon gone", 1.0)
    await a.set("long", "stays", 60)
    await wait_for(lambda: b.get_nowait("long") is not None, 15, "b never saw the writes")
    await wait_for(lambda: b.get_nowait("short") is None, 10, "b still serves an expired entry")
    await wait_for(lambda: a.get_nowait("short") is None, 10, "a still serves an expired entry")
    assert await a.get("long") == await b.get("long") == "stays"


async def tombstoned_keys(bootstrap: str, topic: str, wanted: set[bytes]) -> set[bytes]:
    """Keys of ``topic`` whose newest record is a tombstone, once ``wanted`` are among them."""
    found: set[bytes] = set()
    for _ in range(100):
        records = await asyncio.to_thread(read_topic, bootstrap, topic)
        found = {key for key, value, _ in records if key is not None and value is None}
        if wanted <= found:
            break
        await asyncio.sleep(0.1)
    return found


@pytest.mark.parametrize("how", ["lazily on get", "by the sweep"])
async def test_expired_entries_are_tombstoned(kafka_bootstrap_servers: str, how: str) -> None:
    sweep_s = 0.2 if how == "by the sweep" else None
    prefix = unique_name("cache")
    async with KafkaCacheStore(
        kafka_bootstrap_servers, prefix=prefix, sweep_interval_s=sweep_s
    ) as store:
        await store.set("short", "gone soon", 0.3)
        await store.set("long", "stays", 60)
        await asyncio.sleep(0.5)
        if how == "lazily on get":
            assert await store.get("short") is None
        assert await tombstoned_keys(kafka_bootstrap_servers, store.topic, {b"short"}) == {b"short"}
        assert await store.get("long") == "stays"


async def test_a_fresh_worker_restores_live_entries_at_start(
    kafka_bootstrap_servers: str, prefix: str
) -> None:
    async with KafkaCacheStore(kafka_bootstrap_servers, prefix=prefix) as first:
        for i in range(50):
            await first.set(f"key-{i}", {"i": i}, 60)
        await first.set("key-0", {"i": "overwritten"}, 60)
        await first.set("key-1", None, 60)
        await first.set("expired", "x", 0.2)
        await asyncio.sleep(0.5)
    # start() returns only once the table is read to its end: no polling needed here.
    async with KafkaCacheStore(kafka_bootstrap_servers, prefix=prefix) as fresh:
        assert await fresh.get("key-0") == {"i": "overwritten"}
        assert await fresh.get("key-1") is None
        assert await fresh.get("expired") is None
        assert [await fresh.get(f"key-{i}") for i in range(2, 50)] == [
            {"i": i} for i in range(2, 50)
        ]
        assert len(fresh) == 49


async def test_cache_ttl_results_are_shared_between_workers(
    http: httpx.AsyncClient, two_workers: tuple[KafkaCacheStore, KafkaCacheStore]
) -> None:
    a, b = two_workers
    calls: list[str] = []

    @tool(cache_ttl=60)
    async def convert(ctx: ToolContext, currency: str) -> dict[str, object]:
        """Look up an exchange rate (slow, so cached)."""
        calls.append(currency)
        return {"currency": currency, "rate": 1.08}

    on_a = ToolContext(http, tool_name="convert", runtime=WorkerRuntime(a, "turn-a"))
    on_b = ToolContext(http, tool_name="convert", runtime=WorkerRuntime(b, "turn-b"))

    first = await convert.invoke(on_a, {"currency": "EUR"})
    assert not first.cached and calls == ["EUR"]
    assert (await convert.invoke(on_a, {"currency": "EUR"})).cached  # same worker: at once

    key = tool_cache_key("convert", canonical_json({"currency": "EUR"}))
    await wait_for(lambda: b.get_nowait(key) is not None, 15, "b never saw the cached result")
    hit = await convert.invoke(on_b, {"currency": "EUR"})
    assert hit.cached and hit.attempts == 0
    assert (hit.value, hit.text) == (first.value, first.text)
    assert calls == ["EUR"]  # the tool ran once for the whole fleet

    miss = await convert.invoke(on_b, {"currency": "GBP"})  # other arguments, other key
    assert not miss.cached and calls == ["EUR", "GBP"]


async def test_ctx_cache_is_namespaced_per_tool_across_workers(
    http: httpx.AsyncClient, two_workers: tuple[KafkaCacheStore, KafkaCacheStore]
) -> None:
    a, b = two_workers

    @tool
    async def remember(ctx: ToolContext, value: str) -> str:
        await ctx.cache.set("last", value, ttl=60)
        return value

    @tool
    async def recall(ctx: ToolContext) -> str | None:
        found = await ctx.cache.get("last")
        return None if found is None else str(found)

    await remember.invoke(ToolContext(http, runtime=WorkerRuntime(a)), {"value": "from a"})
    await recall.invoke(ToolContext(http, runtime=WorkerRuntime(b)), {})  # runs, reads nothing
    await wait_for(
        lambda: b.get_nowait("tool:remember:last") is not None, 15, "b never saw the entry"
    )
    # The same short key under another tool's name is another entry, on either worker.
    assert (
        await ToolContext(http, tool_name="recall", runtime=WorkerRuntime(b)).cache.get("last")
        is None
    )
    seen = await ToolContext(http, tool_name="remember", runtime=WorkerRuntime(b)).cache.get("last")
    assert seen == "from a"
    recalled = await recall.invoke(ToolContext(http, runtime=WorkerRuntime(b)), {})
    assert recalled.value is None and not recalled.is_error
    assert await a.get("last") is None and await b.get("last") is None  # never un-namespaced


async def test_writes_that_cannot_be_shared_fail_clearly(
    two_workers: tuple[KafkaCacheStore, KafkaCacheStore],
) -> None:
    a, _ = two_workers
    with pytest.raises(UserError, match="not JSON-serializable"):
        await a.set("bad", {1, 2}, 60)
    with pytest.raises(PayloadTooLarge, match=r"'big' is \d+ bytes, over the 1000000-byte"):
        await a.set("big", "x" * 1_100_000, 60)
    assert await a.get("bad") is None and await a.get("big") is None


async def test_an_unreachable_broker_is_named_at_start() -> None:
    address = f"127.0.0.1:{free_port()}"
    store = KafkaCacheStore(address, prefix=unique_name("cache"), start_timeout_s=1)
    with pytest.raises(BrokerUnavailableError, match=address):
        await asyncio.to_thread(store.start)
    store.close()  # closing after a failed start is safe, and so is repeating it
    store.close()
    with pytest.raises(UserError, match="closed"):
        await store.get("anything")


async def test_a_non_compacted_topic_is_refused(kafka_bootstrap_servers: str) -> None:
    prefix = unique_name("cache")
    await asyncio.to_thread(
        apply_topics,
        kafka_bootstrap_servers,
        [TopicSpec(f"{prefix}.cache", 1, {"cleanup.policy": "delete"})],
    )
    store = KafkaCacheStore(kafka_bootstrap_servers, prefix=prefix)
    with pytest.raises(TopicDriftError, match=r"cleanup\.policy"):
        await asyncio.to_thread(store.start)


async def test_lifecycle_is_one_way_and_stopping_repeats(
    kafka_bootstrap_servers: str, prefix: str
) -> None:
    store = KafkaCacheStore(kafka_bootstrap_servers, prefix=prefix)
    with pytest.raises(UserError, match="call start"):
        await store.get("k")
    await asyncio.to_thread(store.start)
    await asyncio.to_thread(store.start)  # already started: nothing to do
    await store.set("k", 1, 60)
    await asyncio.to_thread(store.close)
    await asyncio.to_thread(store.close)
    with pytest.raises(UserError, match="closed"):
        await store.set("k", 2, 60)
    with pytest.raises(UserError, match="create a new one"):
        await asyncio.to_thread(store.start)
