"""``/livez`` and ``/readyz`` for orchestrators, ``/metrics`` for Prometheus.

``/readyz`` turns 503 once a worker stops. ``/metrics`` serves the worker's own registry
in the Prometheus text format.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pyrula_stream.observability.metrics import METRICS_CONTENT_TYPE

READ_TIMEOUT_S = 5.0
"""A connection that has not sent its request line by then is closed: a silent client
must not hold a socket and a task for ever."""
MAX_REQUEST_LINE = 8192


async def start_health_server(
    host: str,
    port: int,
    ready: Callable[[], bool],
    *,
    metrics: Callable[[], bytes] | None = None,
) -> asyncio.Server:
    """Serve the probes (and ``/metrics``) on ``host:port`` until the server is closed."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            raw = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
        except (TimeoutError, ValueError, ConnectionError):  # silent, oversized or gone
            writer.close()
            return
        line = raw.decode(errors="replace")
        path = line.split(" ")[1] if " " in line else "/"
        path = path.split("?", 1)[0]
        content_type = "text/plain; charset=utf-8"
        if path == "/metrics" and metrics is not None:
            status, body, content_type = "200 OK", metrics(), METRICS_CONTENT_TYPE
        else:
            if path == "/livez" or (path == "/readyz" and ready()):
                status = "200 OK"
            elif path == "/readyz":
                status = "503 Service Unavailable"
            else:
                status = "404 Not Found"
            body = status.split(" ", 1)[1].encode()
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, host, port, limit=MAX_REQUEST_LINE)
