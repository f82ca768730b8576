"""The HTTP gateway's cost: what it adds to an event's way to a client, and its memory per
open Server-Sent-Events stream.

One gateway process (``create_app`` under uvicorn, as ``pyrula-stream gateway`` serves it)
and one worker process run on this machine; this process submits ``streams`` turns through
the gateway and follows each over SSE (one HTTP connection per turn, as browsers do), while
a third process follows the same turns with ``KafkaAgentClient.stream`` (its one shared
reader), at the same time. A turn is the one-tool workload with a model that takes
``model_s`` per call (longer with more streams), so every stream is open before the turns'
later events are written.

For each event, ``arrival - ts_ms`` is measured on both paths (``ts_ms`` is when the
worker made the event, before its commit: the same start for both). The gateway's own
figure is the difference: ``gateway_added_p50_ms`` = p50 over SSE - p50 over
``KafkaAgentClient``, the same for p99; only events made after every stream was open
count, so none is a catch-up read. RSS per open stream is the gateway process's growth
from before the streams opened to when all were open, divided by ``streams``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import time
from typing import Any

import httpx

from pyrula_stream.bench.harness import agent_topics, create_topics, drop_topics, unique
from pyrula_stream.bench.stats import percentile
from pyrula_stream.bench.workload import QUESTION, tool_turn_agent
from pyrula_stream.client.kafka_client import KafkaAgentClient

PREFIX = "/agents"
PARTITIONS = 6


def _gateway_process(bootstrap: str, agent: str, streams: int, url: Any, stop: Any) -> None:
    """The spawned gateway: serves ``agent`` by name until ``stop``; ``url`` gets its URL."""
    from pyrula_stream.bench.harness import PREFIX as TOPIC_PREFIX
    from pyrula_stream.gateway import AppOptions, create_app
    from pyrula_stream.gateway.serve import running_gateway

    app = create_app(
        agents=[agent],
        options=AppOptions(
            bootstrap_servers=bootstrap,
            topic_prefix=TOPIC_PREFIX,
            sse_max_streams=streams + 10,
            sse_max_streams_per_owner=streams + 10,
        ),
    )

    async def main() -> None:
        async with running_gateway(app) as served:
            url.put(served)
            await asyncio.to_thread(stop.wait)

    asyncio.run(main())


def _worker_process(bootstrap: str, name: str, model_s: float, slots: int, stop: Any) -> None:
    """The spawned worker of the one-tool agent, ``slots`` turns at once, until ``stop``."""
    from pyrula_stream.runtime.collector import tune_for_worker
    from pyrula_stream.runtime.worker import WorkerOptions
    from pyrula_stream.testing import running_worker

    agent = tool_turn_agent(name, latency_s=model_s, partitions=PARTITIONS, steps=1)

    async def main() -> None:
        tune_for_worker()
        options = WorkerOptions(max_concurrent_turns=slots)
        async with running_worker(agent, bootstrap, options, all_partitions=True):
            await asyncio.to_thread(stop.wait)

    asyncio.run(main())


def _rss_kb(pid: int) -> int:
    import psutil  # type: ignore[import-untyped,unused-ignore]

    return int(psutil.Process(pid).memory_info().rss // 1024)


async def _sse(
    http: httpx.AsyncClient, url: str, opened: asyncio.Event, arrivals: list[tuple[int, float]]
) -> None:
    """Read one turn's SSE stream to its end; each event's ``(ts_ms, arrival ms)``."""
    async with http.stream("GET", url) as response:
        response.raise_for_status()
        opened.set()
        data = None
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line[6:]
            elif not line and data is not None:
                event = json.loads(data)
                arrivals.append((int(event["ts_ms"]), time.time() * 1000))
                data = None


async def _direct(
    client: KafkaAgentClient, agent: str, turn_id: str, arrivals: list[tuple[int, float]]
) -> None:
    async for event in client.stream(agent, turn_id):
        arrivals.append((event.ts_ms, time.time() * 1000))


def _client_process(
    bootstrap: str, prefix: str, agent: str, turn_ids: Any, arrivals: Any, ready: Any
) -> None:
    """The reference path in a process of its own (so the SSE clients' work in the bench
    process does not slow it): ``KafkaAgentClient.stream`` for each turn id it is sent."""

    async def main() -> None:
        async with KafkaAgentClient(bootstrap, prefix=prefix) as client:
            ready.set()
            ids = await asyncio.to_thread(turn_ids.get, True, 300)
            seen: list[tuple[int, float]] = []
            await asyncio.gather(*(_direct(client, agent, t, seen) for t in ids))
            arrivals.put(seen)

    asyncio.run(main())


async def _warm_up(url: str, agent: str) -> None:
    """One turn through the gateway before measuring, on a client of its own: its
    connection idles for the whole turn, and one the server may close must not be reused
    by the measured burst (each measured stream opens its own connection, as browsers do)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        warm = await http.post(f"{PREFIX}/{agent}/turns", json=QUESTION)
        warm.raise_for_status()
        await _sse(http, warm.json()["events_url"], asyncio.Event(), [])


async def run_gateway(
    bootstrap: str, *, streams: int, model_s: float | None = None, keep_topics: bool = False
) -> dict[str, Any]:
    """The gateway phase (see the module docstring). The model takes ``model_s`` per call
    (default: 2 s per 100 streams, at least 2 s), long enough for every stream to be open
    before the turns' later events are made, also on a busy machine."""
    if model_s is None:
        model_s = max(2.0, streams / 50)
    agent = tool_turn_agent(unique("gw"), latency_s=model_s, partitions=PARTITIONS)
    await asyncio.to_thread(create_topics, bootstrap, agent.topic_specs())
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    url_queue = context.Queue()
    gateway = context.Process(
        target=_gateway_process,
        args=(bootstrap, agent.name, streams, url_queue, stop),
        name="bench-gateway",
        daemon=True,
    )
    worker = context.Process(
        target=_worker_process,
        args=(bootstrap, agent.name, model_s, streams, stop),
        name="bench-gateway-worker",
        daemon=True,
    )
    turn_ids, client_arrivals, client_ready = context.Queue(), context.Queue(), context.Event()
    follower = context.Process(
        target=_client_process,
        args=(bootstrap, agent.prefix, agent.name, turn_ids, client_arrivals, client_ready),
        name="bench-gateway-client",
        daemon=True,
    )
    gateway.start()
    worker.start()
    follower.start()
    via_sse: list[tuple[int, float]] = []
    via_client: list[tuple[int, float]] = []
    try:
        url = await asyncio.to_thread(url_queue.get, True, 120)
        await asyncio.to_thread(client_ready.wait, 120)
        await _warm_up(url, agent.name)
        limits = httpx.Limits(max_connections=streams + 20, max_keepalive_connections=streams)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
            assert gateway.pid is not None
            rss_before = _rss_kb(gateway.pid)
            submitted = await asyncio.gather(
                *(http.post(f"{PREFIX}/{agent.name}/turns", json=QUESTION) for _ in range(streams))
            )
            handles = [answer.json() for answer in submitted]
            turn_ids.put([h["turn_id"] for h in handles])
            opened = [asyncio.Event() for _ in handles]
            tasks = [
                asyncio.create_task(_sse(http, h["events_url"], o, via_sse))
                for h, o in zip(handles, opened, strict=True)
            ]
            await asyncio.wait_for(asyncio.gather(*(o.wait() for o in opened)), 120)
            all_open_ms = time.time() * 1000
            rss_open = _rss_kb(gateway.pid)
            await asyncio.wait_for(asyncio.gather(*tasks), 300)
            via_client = await asyncio.to_thread(client_arrivals.get, True, 300)
    finally:
        stop.set()
        for proc in (gateway, worker, follower):
            await asyncio.to_thread(proc.join, 30)
            if proc.is_alive():
                proc.kill()
        if not keep_topics:
            await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))

    def lags(arrivals: list[tuple[int, float]]) -> list[float]:
        return [arrived - ts for ts, arrived in arrivals if ts >= all_open_ms]

    sse, direct = lags(via_sse), lags(via_client)
    p = {
        (name, q): round(percentile(values, q), 1)
        for name, values in (("sse", sse), ("client", direct))
        for q in (50, 99)
    }
    return {
        "streams": streams,
        "model_latency_s": model_s,
        "events_measured_sse": len(sse),
        "events_measured_client": len(direct),
        "sse_p50_ms": p["sse", 50],
        "sse_p99_ms": p["sse", 99],
        "client_p50_ms": p["client", 50],
        "client_p99_ms": p["client", 99],
        "gateway_added_p50_ms": round(p["sse", 50] - p["client", 50], 1),
        "gateway_added_p99_ms": round(p["sse", 99] - p["client", 99], 1),
        "gateway_rss_kb_per_stream": round((rss_open - rss_before) / streams, 2),
    }


def main() -> None:
    """``python -m pyrula_stream.bench.gateway BOOTSTRAP STREAMS``: this phase alone."""
    import sys

    with contextlib.suppress(KeyboardInterrupt):
        print(json.dumps(asyncio.run(run_gateway(sys.argv[1], streams=int(sys.argv[2])))))


if __name__ == "__main__":
    main()
