"""The web UI's server: a Starlette app serving the static page, a JSON API and one
server-sent-events stream of changes, over the shared ``EventFeed``.

- ``GET /api/live?turn=AGENT/TURN_ID``: SSE; the first ``update`` is a snapshot (turn
  summaries, dead letters), the next ones carry only what changed, plus the whole watched
  turn whenever it changed.
- ``GET /api/turns/AGENT/TURN_ID``: one turn (read by id from Kafka when not held).
- ``POST /api/turns/AGENT/TURN_ID/cancel|terminate``: only with ``allow_actions``; sent to
  the control topic by ``KafkaAgentClient``, as ``client.cancel``/``terminate`` do.
- ``GET /api/waiting``: the open questions of the followed agents, oldest first
  (``client.pending``).
- ``POST /api/questions/AGENT/TURN_ID/approve|reject`` (JSON ``key``, ``reason``): only
  with ``allow_actions``, and only for the key names in ``reviewers`` when it is set; the
  answer, sent as ``client.approve``/``reject`` do (to ``<agent>.answers``, which the
  UI's principal may write only as a reviewer).
- ``POST /api/dlq/AGENT/OFFSET/redrive``: only with ``allow_actions``, and only for the
  key names in ``operators`` when it is set; the dead letter
  back to its source, once, noted under the caller's principal (``client/redrive.py``).

Every route sits behind ``HTTPGuard`` (Host, Origin, API keys with a login form).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pyrula_stream.access.http_guard import NO_KEYS, ASGIApp, HTTPAccess, HTTPGuard, principal_of
from pyrula_stream.access.rate_limit import RateLimit, RatePolicy
from pyrula_stream.client.kafka_client import KafkaAgentClient
from pyrula_stream.client.redrive import DeadLetters
from pyrula_stream.errors import PyrulaError
from pyrula_stream.objects.resolver import has_refs
from pyrula_stream.ui.feed import EventFeed, FeedOptions
from pyrula_stream.ui.model import TurnView, UIState
from pyrula_stream.ui.questions import QuestionBoard

STATIC = Path(__file__).parent / "static"
KEEPALIVE_S = 15.0
ACTION_HEADER = "x-pyrula-action"  # a custom header: a cross-site form cannot send it


UI_RATE = RatePolicy(per_second=20.0, burst=60)
"""Each caller's default rate."""


@dataclass(frozen=True)
class UIOptions:
    """How the UI serves: address, who may use it, whether write actions are on, and how
    much it keeps. Beyond loopback, ``access`` needs keys (or ``allow_unauthenticated``)."""

    host: str = "127.0.0.1"
    port: int = 8088
    allow_actions: bool = False
    max_turns: int = 200
    access: HTTPAccess = NO_KEYS
    rate_limit: RatePolicy | None = UI_RATE
    """Each caller's requests (per key, or per address without keys); ``None``: none."""
    reviewers: frozenset[str] | None = None
    """The API key names that may answer questions (approve, reject); ``None``: any key
    that may act. The UI's own Kafka principal must hold the reviewer role besides."""
    operators: frozenset[str] | None = None
    """The API key names that may redrive dead letters; ``None``: any key that may act.
    The UI's own Kafka principal must hold the operator role besides."""


def exposure(options: UIOptions) -> str:
    """What a stranger could do with this UI (for the refusal to serve it unguarded)."""
    exposes = "read every turn's parameters, model output, tool calls and dead letters"
    acts = ", and cancel or terminate any turn, answer its questions and redrive dead letters"
    return exposes + (acts if options.allow_actions else "")


class UIApp:
    """The feed, the state and the routes of one UI process."""

    def __init__(self, feed_options: FeedOptions, options: UIOptions) -> None:
        self.options = options
        self.state = UIState(max_turns=options.max_turns, max_dead_letters=options.max_turns)
        self.feed = EventFeed(feed_options, self.state)
        self.questions = QuestionBoard(
            feed_options, lambda: self.state.agents | set(feed_options.agents or ())
        )
        self._client: KafkaAgentClient | None = None
        self.routes = Starlette(
            routes=[
                Route("/", self.index),
                Route("/api/live", self.live),
                Route("/api/turns/{agent}/{turn_id}", self.turn),
                Route("/api/turns/{agent}/{turn_id}/{action}", self.action, methods=["POST"]),
                Route("/api/waiting", self.waiting),
                Route("/api/evals", self.evals),
                Route("/api/questions/{agent}/{turn_id}/{answer}", self.answer, methods=["POST"]),
                Route("/api/dlq/{agent}/{offset:int}/redrive", self.redrive, methods=["POST"]),
                Mount("/static", StaticFiles(directory=STATIC), name="static"),
            ],
            lifespan=self.lifespan,
        )
        inner: ASGIApp = self.routes
        if options.rate_limit is not None:  # inside the guard, which names the key
            inner = RateLimit(inner, options.rate_limit)
        self.app: ASGIApp = HTTPGuard(
            inner,
            options.access,
            bind_host=options.host,
            exposes=exposure(options),
            browser_login=True,
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(self.feed.run(), name="pyrula-ui-feed")
        board = asyncio.create_task(self.questions.run(), name="pyrula-ui-questions")
        try:
            yield
        finally:
            await self.feed.stop()
            await self.questions.stop()
            await task
            await board
            if self._client is not None:
                await self._client.close()

    async def index(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    def _config(self) -> dict[str, Any]:
        return {
            "allow_actions": self.options.allow_actions,
            "reviewers": sorted(self.options.reviewers or ()),
            "operators": sorted(self.options.operators or ()),
            "signed_in": self.options.access.auth is not None,
            "prefix": self.feed.options.prefix,
            "max_turns": self.options.max_turns,
            "max_dead_letters": self.state.max_dead_letters,
            "agents": sorted(self.state.agents),
            "error": self.feed.error,
            "skipped_events": self.feed.undecodable + self.feed.unshowable,
        }

    async def live(self, request: Request) -> Response:
        watched = request.query_params.get("turn", "")
        agent, _, turn_id = watched.partition("/")

        async def updates() -> AsyncIterator[str]:
            sent = 0
            yield "retry: 1000\n\n"
            snapshot = True
            while True:
                if not snapshot and not await self.feed.wait_changed(sent, KEEPALIVE_S):
                    if self.feed.stopping:
                        return
                    yield ": keep-alive\n\n"
                    continue
                version = self.state.version
                body: dict[str, Any] = {
                    "snapshot": snapshot,
                    "version": version,
                    "config": self._config(),
                    "turns": [t.summary() for t in self.state.all_turns() if t.version > sent],
                    "dead_letters": [
                        d.as_json() for d in self.state.all_dead_letters() if d.version > sent
                    ],
                }
                turn = self.state.find(agent, turn_id) if turn_id else None
                if turn is not None and turn.version > sent:
                    body["turn"] = self._detail(turn)
                yield f"event: update\ndata: {json.dumps(body, default=str)}\n\n"
                sent, snapshot = version, False

        return StreamingResponse(
            updates(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def turn(self, request: Request) -> Response:
        agent, turn_id = request.path_params["agent"], request.path_params["turn_id"]
        turn = self.state.find(agent, turn_id)
        if turn is None or turn.partial or has_refs(turn.detail()):
            try:
                turn = await self.feed.load_turn(agent, turn_id) or turn
            except Exception as exc:  # the topic may be missing: say so, keep serving
                return JSONResponse({"error": f"cannot read turn {turn_id}: {exc}"}, 502)
        if turn is None:
            return JSONResponse(
                {"error": f"no events for turn {turn_id} of agent {agent}"}, status_code=404
            )
        return JSONResponse(self._detail(turn))

    def _detail(self, turn: TurnView) -> dict[str, Any]:
        """A turn's page: its timeline and the scores evaluators gave it."""
        return {**turn.detail(), "scores": self.feed.scores.of_turn(turn.agent, turn.turn_id)}

    async def evals(self, request: Request) -> Response:
        """Per agent, its versions compared by the scores the UI read (``evals report``)."""
        board = self.feed.scores
        return JSONResponse(
            {"agents": [board.summary(agent) for agent in board.agents()]}, headers=NO_STORE
        )

    async def action(self, request: Request) -> Response:
        if not self.options.allow_actions:
            return JSONResponse(
                {"error": "actions are off; start the UI with --allow-actions"}, 403
            )
        if ACTION_HEADER not in request.headers:
            return JSONResponse({"error": f"missing header {ACTION_HEADER}"}, 400)
        agent, turn_id = request.path_params["agent"], request.path_params["turn_id"]
        action = request.path_params["action"]
        client = self.client()
        send: dict[str, Callable[..., Awaitable[object]]] = {
            "cancel": client.cancel,
            "terminate": client.terminate,
        }
        if action not in send:
            return JSONResponse({"error": f"unknown action {action!r}: cancel or terminate"}, 404)
        try:
            await send[action](agent, turn_id, reason="from pyrula-stream ui")
        except PyrulaError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        return JSONResponse({"sent": action, "turn_id": turn_id})

    def client(self) -> KafkaAgentClient:
        if self._client is None:
            self._client = KafkaAgentClient(
                self.feed.options.bootstrap_servers,
                prefix=self.feed.options.prefix,
                kafka_config=self.feed.options.kafka_config,
            )
        return self._client

    async def waiting(self, request: Request) -> Response:
        """Every followed agent's open questions, oldest first (from the one journal
        follower, ``QuestionBoard``: a poll reads nothing from Kafka)."""
        found, errors = self.questions.questions()
        return JSONResponse(
            {"questions": [q.as_dict() for q in found], "errors": errors}, headers=NO_STORE
        )

    async def answer(self, request: Request) -> Response:
        if not self.options.allow_actions:
            return JSONResponse(
                {"error": "actions are off; start the UI with --allow-actions"}, 403
            )
        if ACTION_HEADER not in request.headers:
            return JSONResponse({"error": f"missing header {ACTION_HEADER}"}, 400)
        sender = principal_of(request.scope)
        reviewers = self.options.reviewers
        if reviewers is not None and sender not in reviewers:
            return JSONResponse(
                {"error": f"{sender or 'this key'} is not a reviewer: only reviewers answer"}, 403
            )
        agent, turn_id = request.path_params["agent"], request.path_params["turn_id"]
        answer = request.path_params["answer"]
        if answer not in ("approve", "reject"):
            return JSONResponse({"error": f"unknown answer {answer!r}: approve or reject"}, 404)
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("key"), str):
            return JSONResponse({"error": "send JSON with the question's key"}, 400)
        reason = body.get("reason") if isinstance(body.get("reason"), str) else None
        client = self.client()
        send = client.approve if answer == "approve" else client.reject
        try:
            receipt = await send(
                agent,
                turn_id,
                body["key"],
                reason=reason or None,
                sender=sender or "pyrula-stream ui",  # the API key's name
            )
        except PyrulaError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        return JSONResponse({"sent": answer, "key": body["key"], "accepted": receipt.accepted})

    async def redrive(self, request: Request) -> Response:
        if not self.options.allow_actions:
            return JSONResponse(
                {"error": "actions are off; start the UI with --allow-actions"}, 403
            )
        if ACTION_HEADER not in request.headers:
            return JSONResponse({"error": f"missing header {ACTION_HEADER}"}, 400)
        operators = self.options.operators
        if operators is not None and principal_of(request.scope) not in operators:
            who = principal_of(request.scope) or "this key"
            return JSONResponse({"error": f"{who} is not an operator: only operators redrive"}, 403)
        letters = DeadLetters(
            self.feed.options.bootstrap_servers,
            request.path_params["agent"],
            prefix=self.feed.options.prefix,
            kafka_config=self.feed.options.kafka_config,
        )
        by = principal_of(request.scope) or "pyrula-stream ui"  # the API key's name
        offset: int = request.path_params["offset"]
        try:
            (result,) = await asyncio.to_thread(letters.redrive, by=by, offsets=[offset])
        except PyrulaError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        return JSONResponse(result.as_json())


NO_STORE = {"cache-control": "no-store"}
MAX_CONNECTIONS = 256
"""Open connections past which uvicorn answers 503 (an operator's UI, not a public site)."""
KEEP_ALIVE_S = 5
MAX_HEADER_BYTES = 16 * 1024


class UIServer(uvicorn.Server):
    """uvicorn, releasing the live streams first so shutdown does not wait on them."""

    def __init__(self, ui: UIApp) -> None:
        self.ui = ui
        super().__init__(
            uvicorn.Config(
                ui.app,
                host=ui.options.host,
                port=ui.options.port,
                log_level="warning",
                timeout_graceful_shutdown=5,
                limit_concurrency=MAX_CONNECTIONS,
                timeout_keep_alive=KEEP_ALIVE_S,
                h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            )
        )

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.ui.feed.stop()
        await super().shutdown(sockets)

    @property
    def url(self) -> str:
        host = self.ui.options.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.ui.options.port}"


async def serve_ui(feed_options: FeedOptions, options: UIOptions) -> None:
    """Serve until interrupted (Ctrl-C)."""
    await UIServer(UIApp(feed_options, options)).serve()


@contextlib.asynccontextmanager
async def running_ui(feed_options: FeedOptions, options: UIOptions) -> AsyncIterator[str]:
    """Serve the UI in this event loop (tests, notebooks); yields its URL. ``port=0``
    takes a free port."""
    sock = socket.socket(socket.AF_INET6 if ":" in options.host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((options.host, options.port))
        port = sock.getsockname()[1]
        server = UIServer(UIApp(feed_options, dataclasses.replace(options, port=port)))
    except BaseException:
        sock.close()
        raise
    task = asyncio.create_task(server.serve(sockets=[sock]), name="pyrula-ui")
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the UI server stopped before it started")
            await asyncio.sleep(0.05)
        yield server.url
    finally:
        server.should_exit = True
        await task
        sock.close()
