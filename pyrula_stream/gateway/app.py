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

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from confluent_kafka import KafkaException
from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp

from pyrula_stream.access.api_keys import OWNER_METADATA
from pyrula_stream.access.http_guard import HTTPAccess, HTTPGuard, check_bind, principal_of
from pyrula_stream.access.rate_limit import RateLimit
from pyrula_stream.agent.batch import lane_metadata
from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.errors import (
    ErrorCode,
    PyrulaError,
)
from pyrula_stream.gateway import openapi
from pyrula_stream.gateway.errors import (
    GatewayRefusal,
    error_body,
    invalid,
    refusal_of,
    refusal_response,
)
from pyrula_stream.gateway.event_route import (
    CLOCK_SKEW_MS,
    EventStreams,
    EventStreamsFirst,
    PlainASGIRoute,
)
from pyrula_stream.gateway.options import AppOptions
from pyrula_stream.gateway.owners import NOBODY
from pyrula_stream.gateway.served import Gateway, ServedAgent, served_agent
from pyrula_stream.gateway.uploads import check_references, receive_upload, upload_space
from pyrula_stream.objects.resolver import has_refs

RESERVED_METADATA_PREFIX = "pyrula."
"""Metadata keys the gateway drops from a caller's request (see ``end_user_metadata``)."""
OWNER_HEADER = "pyrula-owner"
"""The turn request's header naming the principal who submitted it (as its metadata does)."""

GATEWAY_EXPOSES = "submit, read and stop turns of every agent it serves"


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
