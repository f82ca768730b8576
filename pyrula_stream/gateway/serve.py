"""Serving a gateway app with uvicorn: ``pyrula-stream gateway``, tests and notebooks."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI

from pyrula_stream.runtime import event_loop

MAX_CONNECTIONS = 1024
"""Open connections (streams included) past which uvicorn answers 503: slow or idle
clients cannot exhaust the process's sockets."""
KEEP_ALIVE_S = 5
"""An idle kept-alive connection is closed after this."""
MAX_HEADER_BYTES = 16 * 1024
"""h11's limit on a request's headers (a bigger request is refused)."""


def gateway_event_loop(name: str | None = None) -> str:
    """The gateway's event loop: ``name``, else ``$PYRULA_EVENT_LOOP``, else uvloop when it
    is installed (the gateway extra installs it), as uvicorn itself chooses.

    A worker's default stays asyncio's loop (uvloop costs more per step of a long turn:
    ``runtime.event_loop``); the gateway runs no turns, only sockets, where uvloop's
    transports are lighter and their callbacks cheaper. Measured (bench ``gateway`` phase,
    5,000 SSE streams, three alternating runs each): 30.3, 31.3 and 35.2 KB per stream
    against 34.9, 33.0 and 35.4 on asyncio's loop; an added p50 of 1.3, 0.8 and 1.3 ms
    against 1.7, 1.8 and 1.0. A small gain, within the runs' spread, in the direction
    uvicorn already chooses."""
    return event_loop.chosen(name, default=event_loop.fastest_installed())


def _uvicorn_server(app: FastAPI, host: str, port: int) -> uvicorn.Server:
    # A short graceful shutdown: open SSE streams would hold it; clients resume anyway.
    gateway = getattr(app.state, "gateway", None)
    limit = gateway.options.max_connections if gateway is not None else None
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=2,
        limit_concurrency=limit or MAX_CONNECTIONS,
        timeout_keep_alive=KEEP_ALIVE_S,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )
    return uvicorn.Server(config)


async def serve_gateway(app: FastAPI, host: str, port: int) -> None:
    """Serve until interrupted (Ctrl-C)."""
    await _uvicorn_server(app, host, port).serve()


def run_gateway_server(app: FastAPI, host: str, port: int, loop: str | None = None) -> None:
    """``serve_gateway`` in a loop of its own (``gateway_event_loop(loop)``), as
    ``pyrula-stream gateway`` runs it."""
    event_loop.run(serve_gateway(app, host, port), gateway_event_loop(loop))


@contextlib.asynccontextmanager
async def running_gateway(app: FastAPI, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve ``app`` in this event loop on a free port of ``host``; yields its URL."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        port = sock.getsockname()[1]
        server = _uvicorn_server(app, host, port)
    except BaseException:
        sock.close()
        raise
    task = asyncio.create_task(server.serve(sockets=[sock]), name="pyrula-gateway")
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the gateway stopped before it started")
            await asyncio.sleep(0.02)
        yield f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()
