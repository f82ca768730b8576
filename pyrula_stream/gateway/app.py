"""``create_app``: the HTTP front door of Kafka agents, as a FastAPI app.

A request becomes a record on ``<topic_prefix>.<agent>.turns`` through one
``KafkaAgentClient`` per process, and a turn's committed events come back as
Server-Sent Events through that client's one shared ``read_committed`` reader. Nothing
is kept here that another gateway process could not read from Kafka, so any number of
them serve the same turns behind a load balancer, and a stream resumes on any of them
with ``Last-Event-ID``.

Routes under ``options.prefix`` pass the ``HTTPGuard`` (Host, Origin and key checks);
``/healthz`` and ``/readyz`` stay outside it, for load balancers that carry no key.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from confluent_kafka import KafkaException
from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp

from pyrula_stream.access.api_keys import OWNER_METADATA
from pyrula_stream.access.http_guard import HTTPAccess, HTTPGuard, check_bind, principal_of
from pyrula_stream.access.rate_limit import RateLimit
from pyrula_stream.access.tenant_signature import signed_tenant_headers
from pyrula_stream.agent.batch import lane_metadata
from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.client.kafka_client import KafkaAgentClient, TurnHandle
from pyrula_stream.errors import (
    BrokerUnavailableError,
    ErrorCode,
    PyrulaError,
)
from pyrula_stream.gateway import openapi
from pyrula_stream.gateway.depth import QueueDepths
from pyrula_stream.gateway.errors import (
    GatewayRefusal,
    error_body,
    invalid,
    not_found,
    refusal_of,
    refusal_response,
)
from pyrula_stream.gateway.event_route import (
    CLOCK_SKEW_MS,
    EventStreams,
    EventStreamsFirst,
    PlainASGIRoute,
)
from pyrula_stream.gateway.options import GATEWAY_TENANT_HEADER, AppOptions
from pyrula_stream.gateway.owners import NOBODY, StreamSlots, TurnOwners
from pyrula_stream.gateway.pending import PendingStreams
from pyrula_stream.gateway.uploads import check_references, receive_upload, upload_space
from pyrula_stream.kafka.admin import broker_answers
from pyrula_stream.kafka.connection_log import is_connection_failure
from pyrula_stream.objects.resolver import has_refs
from pyrula_stream.objects.urls import store_from_environment
from pyrula_stream.wire.serde import TurnRequest

RESERVED_METADATA_PREFIX = "pyrula."
"""Metadata keys the gateway drops from a caller's request (see ``end_user_metadata``)."""
OWNER_HEADER = "pyrula-owner"
"""The turn request's header naming the principal who submitted it (as its metadata does)."""

GATEWAY_EXPOSES = "submit, read and stop turns of every agent it serves"
READY_CACHE_S = 1.0


@dataclass(frozen=True)
class ServedAgent:
    """An agent the gateway serves: its topics' prefix and, for a ``KafkaAgent``, the
    check of a request's parameters against its signature (``None``: the worker checks)."""

    name: str
    topic_prefix: str
    validate: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    parameters: dict[str, Any] | None = None


def served_agent(agent: KafkaAgent | str, topic_prefix: str) -> ServedAgent:
    """A name is forwarded as is; a ``KafkaAgent`` validates parameters before producing."""
    if isinstance(agent, str):
        return ServedAgent(agent, topic_prefix)
    from pyrula_stream.context.agent_context import AgentContext
    from pyrula_stream.tools.schema import derive_arguments, validate_arguments

    model, schema = derive_arguments(agent.fn, agent.name, schema=None, context_type=AgentContext)

    def validate(params: Mapping[str, Any]) -> dict[str, Any]:
        return validate_arguments(agent.name, schema, model, params)

    return ServedAgent(agent.name, agent.prefix, validate, schema)


class Gateway:
    """What one app holds: a client per topic prefix (each with its one shared event
    reader), the owners read so far and the open streams."""

    def __init__(self, agents: Sequence[ServedAgent], options: AppOptions) -> None:
        self.options = options
        self.agents = {a.name: a for a in agents}
        self.owners = TurnOwners(
            options.bootstrap_servers,
            kafka_config=options.kafka_config,
            timeout_s=options.kafka_timeout,
        )
        self.slots = StreamSlots(options.sse_max_streams, options.sse_max_streams_per_owner)
        self.depths = QueueDepths(
            options.bootstrap_servers,
            kafka_config=options.kafka_config,
            timeout_s=options.kafka_timeout,
        )
        self.store = store_from_environment(options.object_store)
        """Where uploads and large parameters go, and references are read from."""
        self._clients: dict[str, KafkaAgentClient] = {}
        self._probed: tuple[float, bool] = (0.0, False)
        """``/readyz``'s own last answer: it reports what it asked Kafka, nothing else."""
        self._seen: tuple[float, bool] = (0.0, False)
        """The latest news of Kafka, from the probe or from a submit."""
        self._asking: asyncio.Task[bool] | None = None
        self.pending = PendingStreams()

    def client(self, agent: ServedAgent) -> KafkaAgentClient:
        found = self._clients.get(agent.topic_prefix)
        if found is None:
            found = self._clients[agent.topic_prefix] = KafkaAgentClient(
                self.options.bootstrap_servers,
                prefix=agent.topic_prefix,
                timeout=self.options.kafka_timeout,
                kafka_config=self.options.kafka_config,
                object_store=self.store,
            )
        return found

    async def close(self) -> None:
        self.pending.close()
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    def agent(self, name: str) -> ServedAgent:
        found = self.agents.get(name)
        if found is None:
            raise not_found(f"agent '{name}'")
        return found

    def tenant_headers(
        self, agent: str, turn_id: str, principal: str | None
    ) -> list[tuple[str, bytes]]:
        """The caller's tenant (``options.tenants``, else the principal itself), signed
        for this turn when the gateway has the workers' ``tenant_key``; none without keys."""
        if principal is None:
            return []
        tenant = (self.options.tenants or {}).get(principal, principal)
        key = self.options.tenant_key
        if key is None:
            return [(GATEWAY_TENANT_HEADER, tenant.encode())]
        return signed_tenant_headers(key, agent, turn_id, tenant, GATEWAY_TENANT_HEADER)

    def thread_key(self, principal: str | None, thread_id: str) -> str:
        """With keys, a thread id is the caller's own: ``<principal>:<thread_id>`` on
        Kafka, so no other principal can read, extend or delete it."""
        return thread_id if principal is None else f"{principal}:{thread_id}"

    async def check_owner(
        self, agent: ServedAgent, turn_id: str, thread_id: str | None, principal: str | None
    ) -> str:
        """The principal may see the turn, or ``404`` as if it did not exist. Without
        keys every caller may see every turn."""
        if principal is None:
            return NOBODY
        key = self.thread_key(principal, thread_id) if thread_id else turn_id
        owner = await self.owners.owner(agent.topic_prefix, agent.name, turn_id, key)
        if owner != principal:
            raise not_found(f"turn {turn_id} of agent '{agent.name}'")
        return owner

    async def admit(self, agent: ServedAgent) -> None:
        """``429`` while more turns wait for the agent's workers than ``max_queue_depth``."""
        limit = self.options.max_queue_depth
        if limit is None:
            return
        waiting = await self.depths.depth(agent.topic_prefix, agent.name)
        if waiting > limit:
            raise GatewayRefusal(
                429,
                f"{waiting} turns of agent '{agent.name}' wait for a worker, more than "
                f"max_queue_depth={limit}; retry later",
                code=ErrorCode.BACKPRESSURE_REJECTED,
                headers={"Retry-After": str(self.options.retry_after_s)},
            )

    async def ready(self) -> bool:
        """Whether Kafka answers (asked at most once a second). A submit's success is not
        taken for an answer here: a probe right after a cut must ask."""
        at, answer = self._probed
        if time.monotonic() - at < READY_CACHE_S:
            return answer
        answer = await asyncio.to_thread(
            broker_answers,
            self.options.bootstrap_servers,
            min(2.0, self.options.kafka_timeout),
            kafka_config=self.options.kafka_config,
        )
        self._probed = self._seen = (time.monotonic(), answer)
        return answer

    def refuse_while_down(self) -> None:
        """``503`` at once while the gateway already knows Kafka is unreachable (``/readyz``
        said so, or a submit found it so), instead of after the produce deadline. A stale
        answer is asked again in the background: a later request sees the news."""
        at, answer = self._seen
        if answer or at == 0.0:
            return
        if time.monotonic() - at >= READY_CACHE_S and (self._asking is None or self._asking.done()):
            self._asking = asyncio.create_task(self.ready(), name="pyrula-gateway-ready")
        raise GatewayRefusal(
            503,
            "Kafka is not reachable (see /readyz); retry later",
            code=ErrorCode.STORE_UNAVAILABLE,
            headers={"Retry-After": str(self.options.retry_after_s)},
        )

    def saw_kafka(self, answers: bool) -> None:
        """What a request to Kafka just showed (the next ``refuse_while_down`` uses it)."""
        self._seen = (time.monotonic(), answers)

    async def submit(
        self, served: ServedAgent, turn: TurnRequest, headers: list[tuple[str, bytes]]
    ) -> TurnHandle:
        """Produce the turn, its stream opened first (for the events request that
        follows: see ``PendingStreams``) unless an idempotency key may name an older turn."""
        self.refuse_while_down()
        client = self.client(served)
        stream = None
        try:
            if turn.idempotency_key is None:
                stream = await client.open_stream(served.name, turn.turn_id, new_turn=True)
            handle = await client.submit_request(turn, headers=headers)
        except BaseException as exc:
            if isinstance(exc, BrokerUnavailableError) or (
                isinstance(exc, KafkaException) and is_connection_failure(exc)
            ):
                # Whichever call found Kafka gone: a stream's lookup can fail before the
                # produce, sooner than the cached "ready" of the last submit expires.
                self.saw_kafka(False)
            if stream is not None:
                stream.drop()
            raise
        self.saw_kafka(True)
        if stream is not None:
            self.pending.keep(served.name, turn.turn_id, stream)
        return handle


def _lane_fields(deferrable: Any, deadline: Any) -> dict[str, Any]:
    """The body's ``deferrable`` and ``deadline`` as the request's batch-lane metadata. A
    client that submits here reads the turn's stream: without either, the turn stays live
    (``deferrable`` false), whatever the agent's lane says."""
    if deferrable is None and deadline is None:
        deferrable = False
    try:
        return lane_metadata(deferrable, deadline)
    except ValueError as exc:
        name = "deferrable" if "deferrable" in str(exc) else "deadline"
        raise invalid(name, str(exc)) from None


def end_user_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A caller's metadata without what only the gateway or an operator may set: keys
    under ``pyrula.`` (a branch's original, system prompt and model, ...) and ``owner``."""
    return {
        k: v
        for k, v in metadata.items()
        if not str(k).startswith(RESERVED_METADATA_PREFIX) and k != OWNER_METADATA
    }


async def json_body(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object (an empty body is ``{}``), at most ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise GatewayRefusal(413, f"the body is over {limit} bytes", code=ErrorCode.INVALID_REQUEST)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise GatewayRefusal(
                413, f"the body is over {limit} bytes", code=ErrorCode.INVALID_REQUEST
            )
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise GatewayRefusal(
            400, f"the body is not JSON: {exc}", code=ErrorCode.INVALID_REQUEST
        ) from None
    if not isinstance(body, dict):
        raise GatewayRefusal(
            422,
            f"the body must be a JSON object of parameters, got {type(body).__name__}",
            code=ErrorCode.INVALID_REQUEST,
            errors=[{"field": "", "message": "expected an object"}],
        )
    return body


def turn_urls(
    base: str, agent: str, turn_id: str, thread_id: str | None, since_ms: int
) -> dict[str, str]:
    """The turn's URLs; the events URL says from when to read (``since_ms``), so a new
    stream does not move the shared reader back to the partition's start."""
    turn = f"{base}/{quote(agent, safe='')}/turns/{turn_id}"
    thread = {"thread_id": thread_id} if thread_id else {}
    query = f"?{urlencode(thread)}" if thread else ""
    events = urlencode({**thread, "since_ms": max(0, since_ms)})
    return {"events_url": f"{turn}/events?{events}", "status_url": f"{turn}{query}"}


def create_app(*, agents: Sequence[KafkaAgent | str], options: AppOptions | None = None) -> FastAPI:
    """The gateway app: ``options.prefix`` routes behind the guard, plus the probes.

    ``agents`` are ``KafkaAgent`` objects (parameters checked against their signature
    before anything is produced: ``422`` naming the field) or agent names (forwarded;
    the worker checks). Run it with uvicorn, or mount it into your own app.
    """
    options = options or AppOptions()
    if not agents:
        from pyrula_stream.errors import ConfigurationError

        raise ConfigurationError("create_app needs at least one agent (a KafkaAgent or a name)")
    gateway = Gateway([served_agent(a, options.topic_prefix) for a in agents], options)
    access = HTTPAccess(
        auth=options.auth,
        allowed_hosts=options.allowed_hosts,
        allow_unauthenticated=options.allow_unauthenticated,
    )
    bind_host = options.host or "127.0.0.1"
    check_bind(bind_host, access, exposes=GATEWAY_EXPOSES)  # now, not at the first request
    api = FastAPI(
        title="pyrula-stream gateway", openapi_url="/openapi.json", docs_url=None, redoc_url=None
    )
    api.openapi = lambda: openapi.document(  # type: ignore[method-assign]
        api, lambda: list(gateway.agents.values()), options.prefix
    )
    browser = options.static_dir is not None  # a page's EventSource carries a cookie
    streams = EventStreams(gateway)
    _routes(api, gateway, streams)
    guarded_api: ASGIApp = EventStreamsFirst(api, streams=streams)
    if options.rate_limit is not None:  # inside the guard, which names the key
        guarded_api = RateLimit(guarded_api, policy=options.rate_limit)
    guarded_api = HTTPGuard(
        guarded_api,
        access,
        bind_host=bind_host,
        exposes=GATEWAY_EXPOSES,
        browser_login=browser,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await gateway.close()

    app = FastAPI(
        title="pyrula-stream gateway",
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.gateway = gateway

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_document() -> RedirectResponse:
        """Where tools look first; the document is served, behind the guard, with the API."""
        return RedirectResponse(f"{options.prefix.rstrip('/')}/openapi.json", status_code=307)

    if options.include_health:

        @app.get(options.health_path, include_in_schema=False)
        async def healthz() -> dict[str, str]:
            return {"status": "ok"}

    if options.include_ready:

        @app.get(options.ready_path, include_in_schema=False)
        async def readyz() -> JSONResponse:
            if await gateway.ready():
                return JSONResponse({"status": "ready"})
            return JSONResponse(
                error_body("Kafka is not reachable", ErrorCode.STORE_UNAVAILABLE),
                status_code=503,
                headers={"Retry-After": str(options.retry_after_s)},
            )

    app.mount(options.prefix, guarded_api)
    # An open stream's request skips the app's own layers too, straight to the guard.
    app.add_middleware(EventStreamsFirst, streams=guarded_api, prefix=options.prefix)
    if options.static_dir is not None:
        from fastapi.staticfiles import StaticFiles

        page = StaticFiles(directory=options.static_dir, html=True)
        guarded = HTTPGuard(
            page,
            access,
            bind_host=bind_host,
            exposes=GATEWAY_EXPOSES,
            browser_login=True,
        )
        app.mount("/", guarded)  # last: the prefix and the probes match first
    return app


def _routes(api: FastAPI, gateway: Gateway, streams: EventStreams) -> None:
    """The routes of issue 24 (their paths are kept: tools outside the repo use them)."""
    options = gateway.options

    async def on_error(request: Request, exc: Exception) -> Response:
        return refusal_response(refusal_of(exc, options))

    # Our errors, Kafka's and timeouts are answers; anything else is a 500 (in the same
    # shape) that the server also logs.
    for kind in (PyrulaError, KafkaException, TimeoutError, Exception):
        api.add_exception_handler(kind, on_error)

    def base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    @api.get("/")
    async def list_agents() -> dict[str, Any]:
        return {
            "agents": [
                {"name": a.name, "validates": a.validate is not None, "parameters": a.parameters}
                for a in gateway.agents.values()
            ]
        }

    @api.post("/{agent}/turns", status_code=202)
    async def submit(agent: str, request: Request) -> JSONResponse:
        served = gateway.agent(agent)
        principal = principal_of(request.scope)
        limit = options.max_body_bytes
        if gateway.store is not None:  # large parameters go to the store by reference
            limit = max(limit, options.upload_limit(principal))
        body = await json_body(request, limit)
        metadata = body.pop("metadata", None) or {}
        thread_id = body.pop("thread_id", None)
        lane = _lane_fields(body.pop("deferrable", None), body.pop("deadline", None))
        if not isinstance(metadata, dict):
            raise invalid("metadata", "must be an object")
        if thread_id is not None and (not isinstance(thread_id, str) or not thread_id):
            raise invalid("thread_id", "must be a non-empty string")
        params = body
        space = upload_space(served.topic_prefix, agent, principal)
        await check_references(params, gateway.store, space, principal)
        if served.validate is not None and not has_refs(params):  # the worker checks those
            from pyrula_stream.tools.schema import InvalidToolArguments

            try:
                params = served.validate(params)
            except InvalidToolArguments as exc:
                raise GatewayRefusal(
                    422,
                    f"invalid parameters for agent '{agent}': "
                    + "; ".join(f"{e['field']}: {e['message']}" for e in exc.errors),
                    code=ErrorCode.INVALID_REQUEST,
                    errors=exc.errors,
                ) from None
        await gateway.admit(served)
        key = request.headers.get("idempotency-key")
        headers: list[tuple[str, bytes]] = []
        metadata = {**end_user_metadata(metadata), **lane}
        if principal is not None:
            metadata = {**metadata, OWNER_METADATA: principal}
            headers.append((OWNER_HEADER, principal.encode()))
            # one principal's key never names another's turn
            key = None if key is None else f"{principal}:{key}"
        from pyrula_stream.client.kafka_client import new_request

        kafka_thread = gateway.thread_key(principal, thread_id) if thread_id else None
        turn = new_request(agent, key, metadata, kafka_thread, params)
        headers += gateway.tenant_headers(agent, turn.turn_id, principal)
        handle = await gateway.submit(served, turn, headers)
        gateway.owners.remember(agent, handle.turn_id, principal or NOBODY, handle.submitted_ms)
        since_ms = handle.submitted_ms - CLOCK_SKEW_MS
        urls = turn_urls(base(request), agent, handle.turn_id, thread_id, since_ms)
        return JSONResponse({"turn_id": handle.turn_id, **urls}, status_code=202)

    @api.post("/{agent}/uploads", status_code=201)
    async def upload(agent: str, request: Request) -> JSONResponse:
        """One document streamed into the object store; its reference, to pass as a
        parameter's value (docs/object-stores.md)."""
        served = gateway.agent(agent)
        if gateway.store is None:
            raise GatewayRefusal(
                404,
                "uploads need an object store: start the gateway with --object-store",
                code=ErrorCode.INVALID_REQUEST,
            )
        principal = principal_of(request.scope)
        limit = options.upload_limit(principal)
        space = upload_space(served.topic_prefix, agent, principal)
        ref = await receive_upload(request, gateway.store, space, limit, principal)
        return JSONResponse(ref.data(), status_code=201)

    async def events(
        agent: str,
        turn_id: str,
        thread_id: str | None = None,
        since_ms: int | None = None,
        last_event_id: int | None = Query(None, description="or the Last-Event-ID header"),
    ) -> None:
        """The turn's committed events as Server-Sent Events (served by ``EventStreams``)."""

    api.router.routes.append(
        PlainASGIRoute("/{agent}/turns/{turn_id}/events", events, app=streams, methods=["GET"])
    )

    @api.get("/{agent}/turns/{turn_id}")
    async def status(agent: str, turn_id: str, request: Request) -> dict[str, Any]:
        served = gateway.agent(agent)
        principal = principal_of(request.scope)
        thread_id = request.query_params.get("thread_id")
        await gateway.check_owner(served, turn_id, thread_id, principal)
        key = gateway.thread_key(principal, thread_id) if thread_id else None
        found = await gateway.client(served).status(agent, turn_id, key=key)
        return dataclasses.asdict(found)

    @api.post("/{agent}/turns/{turn_id}/cancel", status_code=202)
    async def cancel(agent: str, turn_id: str, request: Request) -> dict[str, Any]:
        served, reason = await _control_target(gateway, agent, turn_id, request)
        await gateway.client(served).cancel(agent, turn_id, reason=reason)
        return {"turn_id": turn_id, "action": "cancel", "reason": reason}

    @api.post("/{agent}/turns/{turn_id}/terminate")
    async def terminate(agent: str, turn_id: str, request: Request) -> dict[str, Any]:
        served, reason = await _control_target(gateway, agent, turn_id, request)
        stopped = await gateway.client(served).terminate(
            agent, turn_id, reason=reason, timeout=options.kafka_timeout * 3
        )
        return dataclasses.asdict(stopped)

    @api.get("/{agent}/threads/{thread_id}")
    async def get_thread(agent: str, thread_id: str, request: Request) -> dict[str, Any]:
        served = gateway.agent(agent)
        key = gateway.thread_key(principal_of(request.scope), thread_id)
        thread = await gateway.client(served).get_thread(agent, key)
        return {"thread_id": thread_id, "turns": [t.to_json() for t in thread.turns]}

    @api.delete("/{agent}/threads/{thread_id}")
    async def delete_thread(agent: str, thread_id: str, request: Request) -> dict[str, Any]:
        served = gateway.agent(agent)
        key = gateway.thread_key(principal_of(request.scope), thread_id)
        deleted = await gateway.client(served).delete_thread(
            agent, key, timeout=options.kafka_timeout * 3
        )
        return {"thread_id": thread_id, "deleted_turns": deleted}


async def _control_target(
    gateway: Gateway, agent: str, turn_id: str, request: Request
) -> tuple[ServedAgent, str | None]:
    """The agent and ``reason`` of a cancel or terminate the caller may send."""
    served = gateway.agent(agent)
    body = await json_body(request, gateway.options.max_body_bytes)
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise invalid("reason", "must be a string")
    thread_id = request.query_params.get("thread_id")
    await gateway.check_owner(served, turn_id, thread_id, principal_of(request.scope))
    return served, reason
