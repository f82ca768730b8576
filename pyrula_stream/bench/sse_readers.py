"""The gateway phase's browsers: processes that each submit and follow a share of the turns
over Server-Sent Events, timing each event when its bytes arrive.

One Python process parsing thousands of streams with a general HTTP client falls behind
the gateway it measures: at 5,000 streams its own queue would be the figure. So the
streams are spread over a few processes, and each reads its connections with a plain
HTTP/1.1 reader (status line, headers, chunked body, SSE frames) that stamps a frame's
arrival before it decodes anything. Submits go through httpx: they are not timed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

Arrival = tuple[str, int, int, float]
"""``(turn_id, seq, ts_ms, arrival ms)`` of one event on one path."""

SUBMIT_ATTEMPTS = 3
"""A submit whose connection fails is sent again (as a client would), counted in the JSON."""
STREAMS_PER_READER = 1250
MAX_READERS = 4


def reader_count(streams: int) -> int:
    """How many reader processes share ``streams``: one per 1,250, at most four."""
    return max(1, min(MAX_READERS, -(-streams // STREAMS_PER_READER)))


async def read_sse(url: str, path: str, opened: asyncio.Event, arrivals: list[Arrival]) -> None:
    """Follow one turn's SSE stream on a connection of its own to its end; each event's
    arrival, stamped when the chunk that completes it has been read."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port, limit=1 << 20)
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 200 " not in status:
            raise RuntimeError(f"SSE {path}: {status.decode(errors='replace')}")
        if b"transfer-encoding: chunked" not in head.lower():
            raise RuntimeError(f"SSE {path}: the gateway did not send a chunked stream")
        opened.set()
        pending = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                return
            chunk = await reader.readexactly(size + 2)
            at = time.time() * 1000
            pending += chunk[:-2]
            while (end := pending.find(b"\n\n")) >= 0:
                frame, pending = pending[:end], pending[end + 2 :]
                for line in frame.split(b"\n"):
                    if line.startswith(b"data: "):
                        event = json.loads(line[6:])
                        arrivals.append((event["turn_id"], event["seq"], int(event["ts_ms"]), at))
    finally:
        writer.close()


async def submit_and_follow(
    url: str,
    agent_path: str,
    body: dict[str, Any],
    slots: list[float],
    on_open: Callable[[list[str], float], None],
) -> tuple[list[Arrival], int]:
    """Submit a turn at each of ``slots`` (wall-clock seconds) and follow it on a
    connection of its own; ``on_open(turn ids, ms)`` once every stream is open. The
    arrivals and the count of retried submits."""
    arrivals: list[Arrival] = []
    turns: list[str] = []
    retried = 0
    opened = [asyncio.Event() for _ in slots]
    followers: list[asyncio.Task[None]] = []
    limits = httpx.Limits(max_connections=len(slots) + 4, max_keepalive_connections=len(slots))
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:

        async def open_one(i: int, at: float) -> None:
            nonlocal retried
            await asyncio.sleep(max(0.0, at - time.time()))
            for attempt in range(SUBMIT_ATTEMPTS):
                try:
                    answer = await http.post(agent_path, json=body)
                    break
                except httpx.TransportError:  # a kept-alive connection closed under it
                    if attempt == SUBMIT_ATTEMPTS - 1:
                        raise
                    retried += 1
            answer.raise_for_status()
            handle = answer.json()
            turns.append(handle["turn_id"])
            path = urlsplit(handle["events_url"]).path
            followers.append(asyncio.create_task(read_sse(url, path, opened[i], arrivals)))

        await asyncio.gather(*(open_one(i, at) for i, at in enumerate(slots)))
        await asyncio.wait_for(asyncio.gather(*(o.wait() for o in opened)), 300)
        on_open(turns, time.time() * 1000)
        await asyncio.wait_for(asyncio.gather(*followers), 300)
    return arrivals, retried


def reader_process(
    url: str, agent_path: str, body: dict[str, Any], slots: list[float], out: Any
) -> None:
    """A spawned reader of its share of the turns: puts ``("open", turn ids, ms)`` on
    ``out`` once all its streams are open, then ``("done", arrivals, retried)``."""

    def opened(turns: list[str], ms: float) -> None:
        out.put(("open", turns, ms))

    arrivals, retried = asyncio.run(submit_and_follow(url, agent_path, body, slots, opened))
    out.put(("done", arrivals, retried))
