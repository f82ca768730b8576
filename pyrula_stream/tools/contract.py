"""``@tool``: a function the model can call, with a schema, retries, a timeout and a cache.

The first parameter is the ``ToolContext``; the others become the JSON Schema the model
fills in (derived with pydantic from the signature and type hints, or given as
``schema=``; see ``tool_schema``, which also checks the model's arguments against it).
``ToolCallable.invoke`` is what the worker's tool loop calls: it never raises
for a tool's own failure, it returns a ``ToolOutcome`` the model can read. Approval is
declared here; ``check_bindable`` refuses it unless the agent opted in with
``human_in_the_loop=True`` (then the turn parks for the reviewer, ``approvals.py``).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import json
import logging
import math
import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, Protocol, overload, runtime_checkable

import httpx
import pydantic_core
from pydantic import BaseModel

from pyrula_stream.errors import (
    ErrorCode,
    NestedDurableOperationError,
    Poison,
    PyrulaError,
    ToolRegistrationError,
    ToolTimeout,
    TurnFailure,
)
from pyrula_stream.llm.base import ToolDefinition
from pyrula_stream.tools.cache import (
    CacheProxy,
    CacheStore,
    CallbackCacheStore,
    InProcessCacheStore,
    read_cached_result,
    tool_cache_key,
    write_cached_result,
)
from pyrula_stream.tools.deadlines import Deadline
from pyrula_stream.tools.retry import RetryPolicy, RetryResult, run_with_retry
from pyrula_stream.tools.schema import InvalidToolArguments, derive_arguments, refusal
from pyrula_stream.tools.schema import validate_arguments as _validate_arguments

__all__ = [
    "DurableToolCaller",
    "InvalidToolArguments",
    "ToolCallable",
    "ToolContext",
    "ToolOutcome",
    "ToolRuntime",
    "ToolSpec",
    "UnserializableToolResult",
    "canonical_json",
    "check_bindable",
    "current_boundary",
    "durable_boundary",
    "encode_result",
    "tool",
]

logger = logging.getLogger(__name__)

TOOL_NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")
KAFKA_APPROVAL_LIMIT = "a Kafka consumer cannot wait for a person's approval"
HUMAN_IN_THE_LOOP_HINT = (
    "bind the agent with @kafka_agent(human_in_the_loop=True) to park the turn until a "
    "reviewer answers"
)
ApprovalRule = bool | Callable[[Mapping[str, Any]], bool]


class UnserializableToolResult(TurnFailure):
    """A tool returned something that cannot become the JSON text the model and journal need."""

    code = ErrorCode.TOOL_ERROR

    def __init__(self, tool_name: str, reason: str, *, kind: str = "tool") -> None:
        super().__init__(
            f"{kind} '{tool_name}' returned a result that is not JSON-serializable ({reason}); "
            "return a str, a JSON-compatible value or a pydantic model"
        )
        self.tool_name = tool_name


# --- durable boundaries ------------------------------------------------------------------

_BOUNDARY: ContextVar[tuple[str, str] | None] = ContextVar("pyrula_durable_boundary", default=None)


def current_boundary() -> tuple[str, str] | None:
    """``("tool", name)`` or ``("step", name)`` while inside an atomic tool or step."""
    return _BOUNDARY.get()


class _Boundary:
    """``durable_boundary``'s context manager: a class, as every tool call enters one (a
    generator-based manager costs twice as much)."""

    __slots__ = ("_mark", "_token")

    def __init__(self, mark: tuple[str, str]) -> None:
        self._mark = mark
        self._token: Token[tuple[str, str] | None] | None = None

    def __enter__(self) -> None:
        self._token = _BOUNDARY.set(self._mark)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _BOUNDARY.reset(self._token)
            self._token = None


def durable_boundary(kind: str, name: str) -> AbstractContextManager[None]:
    """Mark an atomic unit: durable operations started inside it are refused."""
    return _Boundary((kind, name))


@runtime_checkable
class DurableToolCaller(Protocol):
    """An agent context: a direct tool call from agent code goes through its durable path."""

    async def call_tool(
        self, tool: ToolCallable, arguments: dict[str, Any], *, id: str | None = None
    ) -> Any: ...


# --- the context a tool receives ---------------------------------------------------------


class ToolRuntime(Protocol):
    """What the worker's turn runtime gives a bound ``ToolContext``."""

    @property
    def turn_id(self) -> str: ...

    @property
    def cache_store(self) -> CacheStore | None: ...

    def is_cancelled(self) -> bool: ...

    async def emit_status(self, text: str, *, tool_name: str | None) -> None: ...


@dataclass
class ToolContext:
    """The first argument of every tool. Built by the worker, or by hand in a unit test."""

    http: httpx.AsyncClient
    deps: Any = field(default=None, repr=False)  # the user's clients, with their keys
    state: Any = None
    tool_name: str | None = None
    tool_use_id: str | None = None
    call_key: str | None = None
    cache_getter: Callable[[str], Any | None] | None = None
    cache_setter: Callable[[str, Any, float], None] | None = None
    runtime: ToolRuntime | None = field(default=None, kw_only=True)
    _local_cache: InProcessCacheStore | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """Made at first use: a worker builds a context per tool call, most never cache."""

    @property
    def turn_id(self) -> str:
        return self.runtime.turn_id if self.runtime is not None else ""

    @property
    def bound_tool_name(self) -> str | None:
        """``tool_name``, or the tool now running when a hand-built context left it unset."""
        if self.tool_name:
            return self.tool_name
        boundary = current_boundary()
        return boundary[1] if boundary is not None and boundary[0] == "tool" else None

    @property
    def idempotency_key(self) -> str | None:
        """``turn_id:call_key:tool_name``, stable across reruns; ``None`` when unbound."""
        name = self.bound_tool_name
        if not self.turn_id or self.call_key is None or not name:
            return None
        return f"{self.turn_id}:{self.call_key}:{name}"

    @property
    def cancelled(self) -> bool:
        """Poll in long loops: true once the turn is cancelled."""
        return self.runtime is not None and self.runtime.is_cancelled()

    @property
    def cache_store(self) -> CacheStore:
        """The un-namespaced store: the runtime's, else the getter/setter pair, else local."""
        if self.runtime is not None and self.runtime.cache_store is not None:
            return self.runtime.cache_store
        if self.cache_getter is not None or self.cache_setter is not None:
            return CallbackCacheStore(self.cache_getter, self.cache_setter)
        if self._local_cache is None:
            self._local_cache = InProcessCacheStore()
        return self._local_cache

    @property
    def cache(self) -> CacheProxy:
        return CacheProxy(self.cache_store, self.bound_tool_name)

    async def emit_status(self, text: str) -> None:
        """An ephemeral status line for watchers; a no-op on a hand-built context."""
        if self.runtime is not None:
            await self.runtime.emit_status(text, tool_name=self.bound_tool_name)


# --- spec, outcome and result encoding ----------------------------------------------------


@dataclass(frozen=True)
class ToolSpec:
    """Everything ``@tool`` declared, checked at decoration time."""

    name: str
    description: str
    input_schema: dict[str, Any]
    retry: RetryPolicy
    timeout: float
    cache_ttl: float | None
    writes: bool
    read_only: bool
    requires_approval: ApprovalRule
    approval_timeout: float | None
    is_async: bool

    def definition(self) -> ToolDefinition:
        """What the model sees, built once per spec: every turn offering the tool shares it
        (a deep copy of the schema per turn was a cost of every turn)."""
        return self._definition

    @functools.cached_property
    def _definition(self) -> ToolDefinition:
        # A copy: what providers are handed is never the spec's own schema (none edits it).
        return ToolDefinition(self.name, self.description, copy.deepcopy(self.input_schema))

    @property
    def needs_approval_support(self) -> bool:
        return bool(self.requires_approval) or self.approval_timeout is not None


@dataclass(frozen=True)
class ToolOutcome:
    """One finished call as the tool loop records it. ``text`` is not truncated."""

    value: Any
    text: str
    is_error: bool
    attempts: int
    error_code: ErrorCode | None = None
    error_type: str | None = None
    message: str | None = None
    cached: bool = False
    poison: bool = False


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"a {type(value).__name__} is not JSON-serializable")


_CANONICAL = json.JSONEncoder(
    separators=(",", ":"),
    sort_keys=True,
    ensure_ascii=False,
    allow_nan=False,
    default=_json_default,
)
"""One encoder for ``canonical_json`` (``json.dumps`` with options builds one per call)."""


def canonical_json(value: Any) -> str:
    """Compact, sorted-key JSON, so equal values always give byte-equal text (replays, keys)."""
    return _CANONICAL.encode(value)


def encode_result(value: Any, tool_name: str, *, kind: str = "tool") -> str:
    """The text the model reads: a str as is, anything else as canonical JSON.

    ``kind`` only words the error (``"step"`` when a step's result is checked).
    """
    if isinstance(value, str):
        return value
    try:
        return canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise UnserializableToolResult(tool_name, str(exc), kind=kind) from exc


# --- the callable ---------------------------------------------------------------------------


def _thread_left_running(exc: Exception) -> bool:
    return (
        isinstance(exc, ToolTimeout)
        and isinstance(exc.detail, dict)
        and bool(exc.detail.get("thread_still_running"))
    )


class ToolCallable:
    """What ``@tool`` returns: the function plus its ``ToolSpec``; keeps the function's metadata."""

    __name__: str  # set by functools.update_wrapper, declared for type checkers
    __wrapped__: Callable[..., Any]
    runs_before_commit: ClassVar[bool] = True
    """Whether a ``read_only`` spec lets the call run before the model response asking for
    it is committed: yes for a ``@tool`` (its author says so), not for an MCP tool (a
    server's ``readOnlyHint`` is only a hint)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        spec: ToolSpec,
        arguments_model: type[BaseModel] | None,
    ) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        self.spec = spec
        self._arguments_model = arguments_model  # None when ``schema=`` overrides

    @property
    def name(self) -> str:
        return self.spec.name

    def definition(self) -> ToolDefinition:
        return self.spec.definition()

    def event_fields(self) -> dict[str, Any]:
        """Extra ``tool:start`` fields; an MCP tool adds its server and ``destructive`` hint."""
        return {}

    def __repr__(self) -> str:
        return f"<tool {self.name!r} wrapping {getattr(self._fn, '__qualname__', self._fn)!r}>"

    def validate_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Keyword arguments for the function, or ``InvalidToolArguments`` naming each bad field.

        Without a ``schema=`` override the derived pydantic model validates (and coerces);
        with one, a minimal JSON Schema check runs and the values pass through unchanged.
        """
        return _validate_arguments(
            self.name, self.spec.input_schema, self._arguments_model, arguments
        )

    async def invoke(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolOutcome:
        """Run one model-requested call; a tool failure comes back as an ``is_error`` outcome.

        Raises only ``UnserializableToolResult`` (a bug in the tool the model cannot fix)
        and ``asyncio.CancelledError``.
        """
        try:
            kwargs = self.validate_arguments(arguments)
        except InvalidToolArguments as exc:
            return self._failure(exc, attempts=0)
        return await self.run_validated(ctx, kwargs)

    async def run_validated(self, ctx: ToolContext, kwargs: Mapping[str, Any]) -> ToolOutcome:
        """``invoke`` for arguments that ``validate_arguments`` already returned."""
        cache_key = self._result_cache_key(kwargs)
        store = ctx.cache_store
        if cache_key is not None:
            hit = await read_cached_result(store, cache_key)
            if hit is not None:
                return ToolOutcome(hit[0], hit[1], is_error=False, attempts=0, cached=True)
        run = await self._run(ctx, kwargs)
        if run.error is not None:
            return self._failure(run.error, attempts=run.attempts)
        text = encode_result(run.value, self.name)
        if cache_key is not None and self.spec.cache_ttl is not None:
            await write_cached_result(store, cache_key, run.value, text, self.spec.cache_ttl)
        return ToolOutcome(value=run.value, text=text, is_error=False, attempts=run.attempts)

    def asks_approval(self, arguments: Mapping[str, Any]) -> bool:
        """Whether a live call with these arguments waits for a reviewer:
        ``requires_approval=True``, or a predicate that returns true or raises."""
        rule = self.spec.requires_approval
        if callable(rule):
            try:
                return bool(rule(dict(arguments)))
            except Exception:  # the seeds: a predicate that raises asks
                return True
        return bool(rule)

    async def __call__(self, ctx: Any, /, *, id: str | None = None, **kwargs: Any) -> Any:
        """A direct call from agent code; ``id=`` keys it when parallel calls share a name.

        Inside a running tool or step it is refused (it would be a durable operation inside
        an atomic one). With an agent context it goes through the durable call path. With a
        hand-built context it just runs and returns the raw value (no cache, no encoding).
        """
        boundary = current_boundary()
        if boundary is not None:
            # A gated call would wait for a person inside an atomic unit: named as such
            # only when its condition holds (a predicate that says no asks nothing).
            operation = "tool approval" if self.asks_approval(kwargs) else "tool call"
            raise NestedDurableOperationError(operation, self.name, boundary[0], boundary[1])
        if isinstance(ctx, DurableToolCaller):
            return await ctx.call_tool(self, dict(kwargs), id=id)
        run = await self._run(ctx, self.validate_arguments(kwargs))
        if run.error is not None:
            raise run.error
        return run.value

    def _result_cache_key(self, kwargs: Mapping[str, Any]) -> str | None:
        if self.spec.cache_ttl is None:
            return None
        try:
            canonical = canonical_json(pydantic_core.to_jsonable_python(kwargs))
        except (TypeError, ValueError, pydantic_core.PydanticSerializationError):
            logger.debug("tool %r: arguments have no JSON form; not cached", self.name)
            return None
        return tool_cache_key(self.name, canonical)

    def _failure(self, exc: Exception, *, attempts: int) -> ToolOutcome:
        message = str(exc)
        return ToolOutcome(
            value=None,
            text=f"{type(exc).__name__}: {message}" if message else type(exc).__name__,
            is_error=True,
            attempts=attempts,
            error_code=exc.code if isinstance(exc, PyrulaError) else ErrorCode.TOOL_ERROR,
            error_type=type(exc).__name__,
            message=message,
            poison=isinstance(exc, Poison),
        )

    async def _run(self, ctx: Any, kwargs: Mapping[str, Any]) -> RetryResult:
        """Attempts under the retry policy; the last error is returned, not raised."""

        def give_up(exc: Exception) -> bool:
            cancelled = isinstance(ctx, ToolContext) and ctx.cancelled
            return cancelled or _thread_left_running(exc)

        return await run_with_retry(
            self.spec.retry,
            lambda: self._attempt(ctx, kwargs),
            give_up=give_up,
            label=f"tool {self.name!r}",
        )

    async def _attempt(self, ctx: Any, kwargs: Mapping[str, Any]) -> Any:
        timeout = self.spec.timeout
        with durable_boundary("tool", self.name):
            if not self.spec.is_async:
                return await self._attempt_in_thread(ctx, kwargs)
            deadline = Deadline(timeout)
            try:
                async with deadline:
                    return await self._fn(ctx, **kwargs)
            except TimeoutError as exc:
                if not deadline.expired():
                    raise  # the tool's own TimeoutError, not our deadline
                raise ToolTimeout(
                    f"tool '{self.name}' timed out after {timeout:g}s",
                    detail={"timeout_s": timeout},
                ) from exc

    async def _attempt_in_thread(self, ctx: Any, kwargs: Mapping[str, Any]) -> Any:
        timeout = self.spec.timeout
        task = asyncio.ensure_future(asyncio.to_thread(functools.partial(self._fn, ctx, **kwargs)))
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        finally:
            if not task.done():
                task.cancel()  # drops the late result; the thread itself cannot be stopped
        if task in done:
            return task.result()
        raise ToolTimeout(
            f"tool '{self.name}' timed out after {timeout:g}s; it is a sync function, so its "
            "thread could not be stopped and keeps running (its late result is discarded). "
            "It was not retried, since a retry would run a second copy beside it: use "
            "async def to retry on timeout",
            detail={"timeout_s": timeout, "thread_still_running": True},
        )


# --- the decorator ----------------------------------------------------------------------------


def _positive_seconds(value: Any, option: str, tool_name: str) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise refusal(tool_name, f"{option} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _build_tool(
    fn: Callable[..., Any],
    *,
    retry: int | RetryPolicy,
    timeout: float,
    name: str | None,
    description: str | None,
    schema: dict[str, Any] | None,
    cache_ttl: float | None,
    writes: bool,
    read_only: bool,
    requires_approval: ApprovalRule,
    approval_timeout: timedelta | float | None,
) -> ToolCallable:
    if not callable(fn) or isinstance(fn, type | ToolCallable):
        raise ToolRegistrationError(f"@tool decorates a function, got {fn!r}")
    tool_name = name if name is not None else getattr(fn, "__name__", "")
    if not isinstance(tool_name, str) or not TOOL_NAME_PATTERN.fullmatch(tool_name):
        raise ToolRegistrationError(
            f"tool name {tool_name!r} is invalid: use 1 to 64 characters from [a-zA-Z0-9_-]"
        )
    if read_only and writes:
        raise refusal(tool_name, "read_only=True and writes=True contradict each other")
    if not (isinstance(requires_approval, bool) or callable(requires_approval)):
        raise refusal(tool_name, "requires_approval must be a bool or a function of the arguments")
    if isinstance(retry, RetryPolicy):
        policy = retry
    elif isinstance(retry, int) and not isinstance(retry, bool) and retry >= 0:
        policy = RetryPolicy.from_retries(retry)
    else:
        raise refusal(tool_name, f"retry must be an int >= 0 or a RetryPolicy, got {retry!r}")
    arguments_model, input_schema = derive_arguments(
        fn, tool_name, schema=schema, context_type=ToolContext
    )
    spec = ToolSpec(
        name=tool_name,
        description=description if description is not None else inspect.cleandoc(fn.__doc__ or ""),
        input_schema=input_schema,
        retry=policy,
        timeout=_positive_seconds(timeout, "timeout", tool_name),
        cache_ttl=None
        if cache_ttl is None
        else _positive_seconds(cache_ttl, "cache_ttl", tool_name),
        writes=bool(writes),
        read_only=bool(read_only),
        requires_approval=requires_approval,
        approval_timeout=None
        if approval_timeout is None
        else _positive_seconds(approval_timeout, "approval_timeout", tool_name),
        is_async=inspect.iscoroutinefunction(fn),
    )
    return ToolCallable(fn, spec, arguments_model)


@overload
def tool(
    fn: Callable[..., Any],
    /,
    *,
    retry: int | RetryPolicy = ...,
    timeout: float = ...,
    name: str | None = ...,
    description: str | None = ...,
    schema: dict[str, Any] | None = ...,
    cache_ttl: float | None = ...,
    writes: bool = ...,
    read_only: bool = ...,
    requires_approval: ApprovalRule = ...,
    approval_timeout: timedelta | float | None = ...,
) -> ToolCallable: ...
@overload
def tool(
    fn: None = None,
    /,
    *,
    retry: int | RetryPolicy = ...,
    timeout: float = ...,
    name: str | None = ...,
    description: str | None = ...,
    schema: dict[str, Any] | None = ...,
    cache_ttl: float | None = ...,
    writes: bool = ...,
    read_only: bool = ...,
    requires_approval: ApprovalRule = ...,
    approval_timeout: timedelta | float | None = ...,
) -> Callable[[Callable[..., Any]], ToolCallable]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    retry: int | RetryPolicy = 0,
    timeout: float = 30.0,
    name: str | None = None,
    description: str | None = None,
    schema: dict[str, Any] | None = None,
    cache_ttl: float | None = None,
    writes: bool = False,
    read_only: bool = False,
    requires_approval: ApprovalRule = False,
    approval_timeout: timedelta | float | None = None,
) -> ToolCallable | Callable[[Callable[..., Any]], ToolCallable]:
    """Declare a tool; use bare (``@tool``) or with options (``@tool(retry=2)``).

    Every mistake (bad name, missing context parameter, contradictory flags) is raised
    here, at import time, rather than on the first call in a running consumer.
    """

    def decorate(function: Callable[..., Any]) -> ToolCallable:
        return _build_tool(
            function,
            retry=retry,
            timeout=timeout,
            name=name,
            description=description,
            schema=schema,
            cache_ttl=cache_ttl,
            writes=writes,
            read_only=read_only,
            requires_approval=requires_approval,
            approval_timeout=approval_timeout,
        )

    return decorate if fn is None else decorate(fn)


def check_bindable(tool: ToolCallable, *, agent_name: str, human_in_the_loop: bool = False) -> None:
    """Refuse a tool that needs a person's approval, unless the agent opted in to parking
    its turns for a reviewer (``human_in_the_loop``): by default a Kafka consumer does
    not wait for a person."""
    if human_in_the_loop:
        return
    spec = tool.spec
    declared: list[str] = []
    if callable(spec.requires_approval):
        declared.append("a requires_approval predicate")
    elif spec.requires_approval:
        declared.append("requires_approval=True")
    if spec.approval_timeout is not None:
        declared.append(f"approval_timeout={spec.approval_timeout:g}s")
    if declared:
        raise ToolRegistrationError(
            f"agent '{agent_name}' cannot offer tool '{spec.name}': it declares "
            f"{' and '.join(declared)}, but {KAFKA_APPROVAL_LIMIT} by default. Remove the "
            f"approval options, or {HUMAN_IN_THE_LOOP_HINT}"
        )
