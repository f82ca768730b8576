"""Serving a gateway app with uvicorn: ``pyrula-stream gateway``, tests and notebooks."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI

MAX_CONNECTIONS = 1024
"""Open connections (streams included) past which uvicorn answers 503: slow or idle
clients cannot exhaust the process's sockets."""
KEEP_ALIVE_S = 5
"""An idle kept-alive connection is closed after this."""
MAX_HEADER_BYTES = 16 * 1024
"""h11's limit on a request's headers (a bigger request is refused)."""


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
