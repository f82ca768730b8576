"""ToolContext (bound and hand-built), ctx.cache namespacing and the cache stores."""

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from pyrula_stream.tools.cache import CacheProxy, CacheStore, InProcessCacheStore
from pyrula_stream.tools.contract import ToolContext, tool


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


class RecordingRuntime:
    """A real, minimal ToolRuntime: records status lines, cancels on demand."""

    def __init__(self, turn_id: str = "turn-42", cache_store: CacheStore | None = None) -> None:
        self.turn_id = turn_id
        self.cache_store = cache_store
        self.cancel_requested = False
        self.statuses: list[tuple[str, str | None]] = []

    def is_cancelled(self) -> bool:
        return self.cancel_requested

    async def emit_status(self, text: str, *, tool_name: str | None) -> None:
        self.statuses.append((text, tool_name))


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# --- identity and idempotency --------------------------------------------------------------------


def test_idempotency_key_is_turn_call_key_and_tool_name(http: httpx.AsyncClient) -> None:
    ctx = ToolContext(http, tool_name="charge", call_key="2.0", runtime=RecordingRuntime("t-9"))
    assert ctx.turn_id == "t-9"
    assert ctx.idempotency_key == "t-9:2.0:charge"


@pytest.mark.parametrize(
    ("runtime", "call_key", "tool_name"),
    [
        (None, "2.0", "charge"),
        (RecordingRuntime(), None, "charge"),
        (RecordingRuntime(""), "0", "x"),
    ],
)
def test_idempotency_key_is_none_when_unbound(
    http: httpx.AsyncClient, runtime: RecordingRuntime | None, call_key: str | None, tool_name: str
) -> None:
    ctx = ToolContext(http, tool_name=tool_name, call_key=call_key, runtime=runtime)
    assert ctx.idempotency_key is None


def test_hand_built_context_defaults(http: httpx.AsyncClient) -> None:
    ctx = ToolContext(http, deps={"db": "sqlite"})
    assert ctx.turn_id == "" and ctx.idempotency_key is None and not ctx.cancelled
    assert ctx.deps == {"db": "sqlite"} and ctx.state is None and ctx.http is http


async def test_tool_name_falls_back_to_the_running_tool(http: httpx.AsyncClient) -> None:
    runtime = RecordingRuntime("t-1")
    ctx = ToolContext(http, call_key="0.1", runtime=runtime)

    @tool
    async def charge(ctx: ToolContext) -> str:
        await ctx.emit_status("charging")
        return ctx.idempotency_key or "unbound"

    outcome = await charge.invoke(ctx, {})
    assert outcome.text == "t-1:0.1:charge"
    assert runtime.statuses == [("charging", "charge")]


# --- cancellation and status ---------------------------------------------------------------------


async def test_cancelled_reflects_the_runtime_and_stops_retries(http: httpx.AsyncClient) -> None:
    runtime = RecordingRuntime()
    ctx = ToolContext(http, tool_name="poll", runtime=runtime)
    calls: list[int] = []

    @tool(retry=5)
    async def poll(ctx: ToolContext) -> str:
        calls.append(1)
        runtime.cancel_requested = True
        raise ConnectionError("backend down")

    assert not ctx.cancelled
    outcome = await poll.invoke(ctx, {})
    assert ctx.cancelled and outcome.attempts == 1 and calls == [1]


async def test_emit_status_goes_to_the_runtime_or_nowhere(http: httpx.AsyncClient) -> None:
    runtime = RecordingRuntime()
    await ToolContext(http, tool_name="search", runtime=runtime).emit_status("searching")
    await ToolContext(http).emit_status("nobody listens")  # hand-built: a no-op
    assert runtime.statuses == [("searching", "search")]


# --- ctx.cache -----------------------------------------------------------------------------------


async def test_ctx_cache_is_namespaced_per_tool(http: httpx.AsyncClient) -> None:
    store = InProcessCacheStore()
    ctx = ToolContext(http, runtime=RecordingRuntime(cache_store=store))

    @tool
    async def rates(ctx: ToolContext, value: str) -> Any:
        before = await ctx.cache.get("shared")
        await ctx.cache.set("shared", value, ttl=300)
        return before

    @tool
    async def fees(ctx: ToolContext, value: str) -> Any:
        before = await ctx.cache.get("shared")
        await ctx.cache.set("shared", value, ttl=300)
        return before

    assert (await rates.invoke(ctx, {"value": "r1"})).value is None
    assert (await fees.invoke(ctx, {"value": "f1"})).value is None
    assert (await rates.invoke(ctx, {"value": "r2"})).value == "r1"
    assert await store.get("tool:rates:shared") == "r2"
    assert await store.get("tool:fees:shared") == "f1"


async def test_cache_store_selection(http: httpx.AsyncClient) -> None:
    runtime_store = InProcessCacheStore()
    bound = ToolContext(http, tool_name="t", runtime=RecordingRuntime(cache_store=runtime_store))
    await bound.cache.set("k", 1, ttl=10)
    assert await runtime_store.get("tool:t:k") == 1

    written: list[tuple[str, Any, float]] = []
    callbacks = ToolContext(
        http,
        tool_name="t",
        cache_getter=lambda key: "from-getter",
        cache_setter=lambda key, value, ttl: written.append((key, value, ttl)),
        runtime=RecordingRuntime(cache_store=None),
    )
    await callbacks.cache.set("k", 2, ttl=10)
    assert written == [("tool:t:k", 2, 10.0)]
    assert await callbacks.cache.get("k") == "from-getter"

    local = ToolContext(http, tool_name="t")
    await local.cache.set("k", 3, ttl=10)
    assert await local.cache.get("k") == 3
    assert await ToolContext(http, tool_name="t").cache.get("k") is None  # per context


async def test_cache_proxy_refuses_bad_input() -> None:
    proxy = CacheProxy(InProcessCacheStore(), "t")
    for bad_ttl in (0, -1, float("nan"), True):
        with pytest.raises(ValueError, match="ttl"):
            await proxy.set("k", 1, ttl=bad_ttl)
    with pytest.raises(ValueError, match="None cannot be cached"):
        await proxy.set("k", None, ttl=1)
    with pytest.raises(TypeError, match="cache keys are str"):
        await proxy.get(5)  # type: ignore[arg-type]
    assert proxy.key_for("rates") == "tool:t:rates"


# --- InProcessCacheStore -------------------------------------------------------------------------


async def test_in_process_store_expires_entries() -> None:
    clock = ManualClock()
    store = InProcessCacheStore(clock=clock)
    await store.set("a", {"v": 1}, 10)
    clock.now = 9.99
    assert await store.get("a") == {"v": 1}
    clock.now = 10.0
    assert await store.get("a") is None
    assert len(store) == 0
    assert await store.get("never-set") is None


async def test_in_process_store_non_positive_ttl_deletes() -> None:
    store = InProcessCacheStore()
    await store.set("a", 1, 10)
    await store.set("a", 2, 0)
    assert await store.get("a") is None


async def test_in_process_store_evicts_expired_then_oldest() -> None:
    clock = ManualClock()
    store = InProcessCacheStore(clock=clock, max_entries=2)
    await store.set("short", 1, 1)
    await store.set("old", 2, 100)
    clock.now = 5  # "short" has expired
    await store.set("new", 3, 100)
    assert (await store.get("old"), await store.get("new")) == (2, 3)
    await store.set("newest", 4, 100)  # nothing expired: the oldest write goes
    assert await store.get("old") is None and len(store) == 2
    assert isinstance(store, CacheStore)
