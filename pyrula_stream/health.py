"""``/livez`` and ``/readyz`` for orchestrators; ``/readyz`` turns 503 once a worker stops."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def start_health_server(host: str, port: int, ready: Callable[[], bool]) -> asyncio.Server:
    """Serve the two probes on ``host:port`` until the returned server is closed."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode(errors="replace")
        path = line.split(" ")[1] if " " in line else "/"
        if path == "/livez" or (path == "/readyz" and ready()):
            status = "200 OK"
        elif path == "/readyz":
            status = "503 Service Unavailable"
        else:
            status = "404 Not Found"
        body = status.split(" ", 1)[1].encode()
        head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, host, port)
