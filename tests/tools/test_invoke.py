"""ToolCallable.invoke and direct calls: results, retries, timeouts, cache, boundaries."""

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from pyrula_stream.errors import ErrorCode, Fatal, NestedDurableOperationError, Poison
from pyrula_stream.tools.cache import InProcessCacheStore
from pyrula_stream.tools.contract import (
    InvalidToolArguments,
    ToolContext,
    UnserializableToolResult,
    current_boundary,
    durable_boundary,
    tool,
)
from pyrula_stream.tools.retry import RetryPolicy


@pytest.fixture
async def ctx() -> AsyncIterator[ToolContext]:
    async with httpx.AsyncClient() as http:
        yield ToolContext(http)


class Receipt(BaseModel):
    order_id: str
    total_cents: int


class FlakyBackend:
    """Fails the first ``failures`` calls with ``error``, then answers."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def call(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return f"ok after {self.calls}"


# --- results -------------------------------------------------------------------------------------


async def test_str_result_goes_to_the_model_as_is(ctx: ToolContext) -> None:
    @tool
    async def greet(ctx: ToolContext, name: str) -> str:
        return f"hello {name}"

    outcome = await greet.invoke(ctx, {"name": "Åsa"})
    assert (outcome.value, outcome.text, outcome.is_error, outcome.attempts) == (
        "hello Åsa",
        "hello Åsa",
        False,
        1,
    )


async def test_other_results_are_compact_sorted_json(ctx: ToolContext) -> None:
    @tool
    async def stats(ctx: ToolContext) -> dict[str, Any]:
        return {"zeta": 1, "alpha": [1.5, None, True], "mid": {"b": "ü", "a": 2}}

    outcome = await stats.invoke(ctx, {})
    assert outcome.text == '{"alpha":[1.5,null,true],"mid":{"a":2,"b":"ü"},"zeta":1}'
    assert outcome.value["zeta"] == 1


async def test_pydantic_results_are_dumped_in_json_mode(ctx: ToolContext) -> None:
    @tool
    async def checkout(ctx: ToolContext) -> list[Receipt]:
        return [Receipt(order_id="o-1", total_cents=250)]

    outcome = await checkout.invoke(ctx, {})
    assert outcome.text == '[{"order_id":"o-1","total_cents":250}]'
    assert outcome.value == [Receipt(order_id="o-1", total_cents=250)]


@pytest.mark.parametrize("bad_result", [{1, 2}, object(), {"x": float("nan")}, b"raw"])
async def test_unserializable_result_raises_naming_the_tool(
    ctx: ToolContext, bad_result: Any
) -> None:
    @tool
    async def leaky(ctx: ToolContext) -> Any:
        return bad_result

    with pytest.raises(UnserializableToolResult, match="tool 'leaky' returned a result") as info:
        await leaky.invoke(ctx, {})
    assert info.value.code == ErrorCode.TOOL_ERROR


async def test_invalid_arguments_become_an_error_outcome_without_running(ctx: ToolContext) -> None:
    calls: list[int] = []

    @tool
    async def add(ctx: ToolContext, a: int, b: int) -> int:
        calls.append(1)
        return a + b

    outcome = await add.invoke(ctx, {"a": "one"})
    assert outcome.is_error and outcome.attempts == 0 and calls == []
    assert (
        outcome.error_type == "InvalidToolArguments" and outcome.error_code == ErrorCode.TOOL_ERROR
    )
    assert "a: Input should be a valid integer" in outcome.text
    assert "b: required argument is missing" in outcome.text


# --- retries -------------------------------------------------------------------------------------


async def test_int_retry_counts_retries_after_the_first_attempt(ctx: ToolContext) -> None:
    backend = FlakyBackend(failures=2, error=ConnectionError("reset"))

    @tool(retry=2)
    async def fetch(ctx: ToolContext) -> str:
        return backend.call()

    outcome = await fetch.invoke(ctx, {})
    assert (outcome.text, outcome.attempts, backend.calls) == ("ok after 3", 3, 3)


async def test_exhausted_retries_report_the_last_error(ctx: ToolContext) -> None:
    backend = FlakyBackend(failures=10, error=ConnectionError("reset by peer"))

    @tool(retry=1)
    async def fetch(ctx: ToolContext) -> str:
        return backend.call()

    outcome = await fetch.invoke(ctx, {})
    assert outcome.is_error and outcome.attempts == 2 and backend.calls == 2
    assert outcome.text == "ConnectionError: reset by peer"
    assert outcome.error_type == "ConnectionError" and outcome.error_code == ErrorCode.TOOL_ERROR
    assert outcome.value is None and not outcome.poison


@pytest.mark.parametrize(
    ("error", "code", "poison"),
    [(Fatal("card declined"), ErrorCode.FATAL, False), (Poison("corrupt"), ErrorCode.POISON, True)],
)
async def test_fatal_and_poison_are_never_retried(
    ctx: ToolContext, error: Exception, code: ErrorCode, poison: bool
) -> None:
    backend = FlakyBackend(failures=10, error=error)
    policy = RetryPolicy(max_attempts=5, initial_interval=0, retry_on=(Exception, Fatal, Poison))

    @tool(retry=policy)
    async def charge(ctx: ToolContext) -> str:
        return backend.call()

    outcome = await charge.invoke(ctx, {})
    assert outcome.attempts == 1 and backend.calls == 1
    assert outcome.error_code == code and outcome.poison is poison


async def test_policy_retry_on_and_non_retryable_are_respected(ctx: ToolContext) -> None:
    not_listed = FlakyBackend(failures=10, error=TypeError("bug"))
    excluded = FlakyBackend(failures=10, error=KeyError("gone"))
    listed = FlakyBackend(failures=2, error=ValueError("blip"))
    policy = RetryPolicy(
        max_attempts=4,
        initial_interval=0,
        retry_on=(ValueError, LookupError),
        non_retryable=(KeyError,),
    )

    def tool_over(backend: FlakyBackend) -> Any:
        @tool(retry=policy)
        async def call(ctx: ToolContext) -> str:
            return backend.call()

        return call

    for backend, attempts in ((not_listed, 1), (excluded, 1), (listed, 3)):
        assert (await tool_over(backend).invoke(ctx, {})).attempts == attempts
        assert backend.calls == attempts


async def test_backoff_waits_between_attempts(ctx: ToolContext) -> None:
    backend = FlakyBackend(failures=2, error=ConnectionError("reset"))
    policy = RetryPolicy(max_attempts=3, initial_interval=0.02, backoff_coefficient=2, jitter=0)

    @tool(retry=policy)
    async def fetch(ctx: ToolContext) -> str:
        return backend.call()

    started = time.monotonic()
    outcome = await fetch.invoke(ctx, {})
    elapsed = time.monotonic() - started
    assert outcome.attempts == 3 and not outcome.is_error
    assert 0.055 <= elapsed < 2.0  # waits 0.02 + 0.04


async def test_sync_tools_are_retried_on_exceptions(ctx: ToolContext) -> None:
    backend = FlakyBackend(failures=1, error=OSError("disk"))

    @tool(retry=1)
    def read_file(ctx: ToolContext) -> str:
        assert current_boundary() == ("tool", "read_file")  # the thread sees the boundary
        return backend.call()

    outcome = await read_file.invoke(ctx, {})
    assert (outcome.text, outcome.attempts) == ("ok after 2", 2)


# --- timeouts ------------------------------------------------------------------------------------


async def test_async_timeout_is_cancelled_and_retried(ctx: ToolContext) -> None:
    attempts: list[int] = []

    @tool(retry=2, timeout=0.05)
    async def slow_then_fast(ctx: ToolContext) -> str:
        attempts.append(1)
        if len(attempts) < 3:
            await asyncio.sleep(10)
        return "finally"

    outcome = await slow_then_fast.invoke(ctx, {})
    assert (outcome.text, outcome.attempts, len(attempts)) == ("finally", 3, 3)


async def test_async_timeout_outcome(ctx: ToolContext) -> None:
    @tool(retry=1, timeout=0.05)
    async def hang(ctx: ToolContext) -> str:
        await asyncio.sleep(10)
        return "never"

    outcome = await hang.invoke(ctx, {})
    assert outcome.is_error and outcome.attempts == 2
    assert outcome.error_type == "ToolTimeout" and outcome.error_code == ErrorCode.TOOL_ERROR
    assert "tool 'hang' timed out after 0.05s" in outcome.text


async def test_a_tools_own_timeout_error_is_not_mistaken_for_the_deadline(ctx: ToolContext) -> None:
    @tool(timeout=5)
    async def upstream(ctx: ToolContext) -> str:
        raise TimeoutError("upstream gateway")

    outcome = await upstream.invoke(ctx, {})
    assert outcome.error_type == "TimeoutError" and "upstream gateway" in outcome.text


async def test_sync_timeout_is_not_retried_and_says_why(ctx: ToolContext) -> None:
    release = threading.Event()
    calls: list[int] = []

    @tool(retry=3, timeout=0.05)
    def blocking(ctx: ToolContext) -> str:
        calls.append(1)
        release.wait(5)
        return "late"

    try:
        outcome = await blocking.invoke(ctx, {})
    finally:
        release.set()
    assert outcome.is_error and outcome.attempts == 1 and calls == [1]
    assert outcome.error_type == "ToolTimeout" and outcome.error_code == ErrorCode.TOOL_ERROR
    assert "thread could not be stopped" in outcome.text
    assert "use async def to retry on timeout" in outcome.text
    assert outcome.value is None  # the late result is discarded


async def test_cancellation_propagates_and_is_not_retried(ctx: ToolContext) -> None:
    started = asyncio.Event()
    calls: list[int] = []

    @tool(retry=RetryPolicy(max_attempts=5, initial_interval=0, retry_on=(BaseException,)))
    async def wait_forever(ctx: ToolContext) -> str:
        calls.append(1)
        started.set()
        await asyncio.sleep(60)
        return "never"

    task = asyncio.create_task(wait_forever.invoke(ctx, {}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == [1]


# --- cache ---------------------------------------------------------------------------------------


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CacheRuntime:
    """A minimal real ToolRuntime that only supplies a cache store."""

    def __init__(self, store: InProcessCacheStore) -> None:
        self.turn_id = "turn-cache"
        self.cache_store = store

    def is_cancelled(self) -> bool:
        return False

    async def emit_status(self, text: str, *, tool_name: str | None) -> None:
        return None


async def test_cache_hit_miss_and_expiry(ctx: ToolContext) -> None:
    clock = ManualClock()
    store = InProcessCacheStore(clock=clock)
    bound = ToolContext(ctx.http, runtime=CacheRuntime(store))
    calls: list[str] = []

    @tool(cache_ttl=60)
    async def rate(ctx: ToolContext, base: str, quote: str = "EUR") -> dict[str, Any]:
        calls.append(base)
        return {"pair": f"{base}{quote}", "rate": 1.1}

    first = await rate.invoke(bound, {"base": "USD"})
    again = await rate.invoke(bound, {"quote": "EUR", "base": "USD"})  # same canonical args
    other = await rate.invoke(bound, {"base": "GBP"})
    assert not first.cached and again.cached and not other.cached
    assert again.text == first.text and again.value == first.value and again.attempts == 0
    assert calls == ["USD", "GBP"]
    assert len(store) == 2

    clock.now += 61
    expired = await rate.invoke(bound, {"base": "USD"})
    assert not expired.cached and calls == ["USD", "GBP", "USD"]


async def test_only_successes_are_cached(ctx: ToolContext) -> None:
    backend = FlakyBackend(failures=1, error=ConnectionError("reset"))

    @tool(cache_ttl=60)
    async def fetch(ctx: ToolContext) -> str:
        return backend.call()

    assert (await fetch.invoke(ctx, {})).is_error
    second = await fetch.invoke(ctx, {})
    third = await fetch.invoke(ctx, {})
    assert (second.text, second.cached, third.text, third.cached) == (
        "ok after 2",
        False,
        "ok after 2",
        True,
    )
    assert third.value == "ok after 2" and backend.calls == 2


async def test_cache_uses_getter_and_setter_when_given(ctx: ToolContext) -> None:
    entries: dict[str, Any] = {}
    bound = ToolContext(
        ctx.http,
        cache_getter=entries.get,
        cache_setter=lambda key, value, ttl: entries.__setitem__(key, value),
    )

    @tool(cache_ttl=5)
    async def receipt(ctx: ToolContext, order_id: str) -> Receipt:
        return Receipt(order_id=order_id, total_cents=99)

    await receipt.invoke(bound, {"order_id": "o-7"})
    (key,) = entries
    assert key.startswith("tool-result:receipt:")
    hit = await receipt.invoke(bound, {"order_id": "o-7"})
    assert hit.cached and hit.value == {"order_id": "o-7", "total_cents": 99}


# --- direct calls and boundaries -----------------------------------------------------------------


async def test_direct_call_on_a_hand_built_context_just_runs(ctx: ToolContext) -> None:
    backend = FlakyBackend(failures=1, error=ConnectionError("reset"))

    @tool(retry=1)
    async def lookup(ctx: ToolContext, order_id: str) -> Receipt:
        backend.call()
        return Receipt(order_id=order_id, total_cents=5)

    assert await lookup(ctx, order_id="o-1") == Receipt(order_id="o-1", total_cents=5)
    assert backend.calls == 2


async def test_direct_call_of_a_sync_tool_runs_in_a_thread(ctx: ToolContext) -> None:
    caller_thread = threading.get_ident()

    @tool
    def which_thread(ctx: ToolContext) -> bool:
        return threading.get_ident() != caller_thread

    assert await which_thread(ctx) is True


async def test_direct_call_raises_the_tools_error_and_invalid_arguments(ctx: ToolContext) -> None:
    @tool
    async def explode(ctx: ToolContext, n: int) -> str:
        raise Fatal(f"cannot handle {n}")

    with pytest.raises(Fatal, match="cannot handle 3"):
        await explode(ctx, n=3)
    with pytest.raises(InvalidToolArguments, match="n: Input should be a valid integer"):
        await explode(ctx, n="three")


async def test_direct_call_with_an_agent_context_goes_through_the_durable_path() -> None:
    class AgentContext:
        def __init__(self) -> None:
            self.calls: list[tuple[str, dict[str, Any], str | None]] = []

        async def call_tool(
            self, called: Any, arguments: dict[str, Any], *, id: str | None = None
        ) -> str:
            self.calls.append((called.name, arguments, id))
            return "journaled"

    @tool
    async def refund(ctx: ToolContext, cents: int) -> str:
        raise AssertionError("the durable path decides whether the body runs")

    agent_ctx = AgentContext()
    assert await refund(agent_ctx, id="order-9", cents=500) == "journaled"
    assert agent_ctx.calls == [("refund", {"cents": 500}, "order-9")]


async def test_a_direct_call_inside_a_tool_is_refused(ctx: ToolContext) -> None:
    @tool
    async def inner(ctx: ToolContext) -> str:
        return "inner"

    @tool
    async def outer(ctx: ToolContext) -> str:
        assert current_boundary() == ("tool", "outer")
        return str(await inner(ctx))

    outcome = await outer.invoke(ctx, {})
    assert outcome.is_error and outcome.error_type == "NestedDurableOperationError"
    assert "tool call 'inner' cannot run inside tool 'outer'" in outcome.text
    with pytest.raises(NestedDurableOperationError) as info:
        await outer(ctx)
    assert (info.value.operation_name, info.value.boundary_kind) == ("inner", "tool")
    assert current_boundary() is None


async def test_a_direct_call_inside_a_step_is_refused(ctx: ToolContext) -> None:
    @tool
    async def lookup(ctx: ToolContext) -> str:
        return "x"

    with durable_boundary("step", "load-order"), pytest.raises(NestedDurableOperationError) as info:
        await lookup(ctx)
    assert (info.value.boundary_kind, info.value.boundary_name) == ("step", "load-order")
    assert current_boundary() is None
