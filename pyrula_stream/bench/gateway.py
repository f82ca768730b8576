"""The HTTP gateway's cost: what it adds to an event's way to a client, and its memory per
open Server-Sent-Events stream.

One gateway process (``create_app`` under uvicorn, on the loop ``pyrula-stream gateway``
chooses: ``gateway_event_loop``) and one worker process run on this machine; reader
processes (one per 1,250 streams, at most four: ``sse_readers.py``) submit ``streams``
turns through the gateway, spread over ``open_s`` seconds, and follow each over SSE as
soon as it is submitted (one HTTP connection per turn, as browsers do), while another
process follows the same turns with ``KafkaAgentClient.stream`` (its one shared reader),
at the same time.
A turn is the one-tool workload with a model that takes ``model_s`` per call, longer than
the opening, so every stream is open before the turns' later events are written.

For each event, ``arrival - ts_ms`` is measured on both paths (``ts_ms`` is when the
worker made the event, before its commit: the same start for both). The gateway's own
figure is paired per turn: for each turn, the mean over its events of (SSE lag - client
lag) for the same events; ``gateway_added_p50_ms`` and ``gateway_added_p99_ms`` are the
p50 and p99 of those per-turn differences. Only events made after every stream was open
count, so none is a catch-up read. ``gateway_kb_per_stream`` is the gateway process's RSS
growth from before the streams opened to when all were open, divided by ``streams``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

from pyrula_stream.bench.harness import agent_topics, create_topics, drop_topics, unique
from pyrula_stream.bench.sse_readers import Arrival, read_sse, reader_count, reader_process
from pyrula_stream.bench.stats import percentile
from pyrula_stream.bench.workload import QUESTION, tool_turn_agent
from pyrula_stream.client.kafka_client import KafkaAgentClient

PREFIX = "/agents"
PARTITIONS = 6


def _gateway_process(bootstrap: str, agent: str, streams: int, url: Any, stop: Any) -> None:
    """The spawned gateway: serves ``agent`` by name until ``stop``; ``url`` gets its URL."""
    from pyrula_stream.bench.harness import PREFIX as TOPIC_PREFIX
    from pyrula_stream.gateway import AppOptions, create_app
    from pyrula_stream.gateway.serve import gateway_event_loop, running_gateway
    from pyrula_stream.runtime import event_loop

    app = create_app(
        agents=[agent],
        options=AppOptions(
            bootstrap_servers=bootstrap,
            topic_prefix=TOPIC_PREFIX,
            sse_max_streams=streams + 10,
            sse_max_streams_per_owner=streams + 10,
            rate_limit=None,  # one caller opens every stream: its rate is the load
            max_connections=2 * streams + 100,  # each stream holds one, submits more
        ),
    )

    async def main() -> None:
        async with running_gateway(app) as served:
            url.put(served)
            await asyncio.to_thread(stop.wait)

    event_loop.run(main(), gateway_event_loop())  # the loop `pyrula-stream gateway` runs on


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


async def _direct(
    client: KafkaAgentClient, agent: str, turn_id: str, arrivals: list[Arrival]
) -> None:
    async for event in client.stream(agent, turn_id):
        arrivals.append((event.turn_id, event.seq, event.ts_ms, time.time() * 1000))


def _client_process(
    bootstrap: str, prefix: str, agent: str, turn_ids: Any, arrivals: Any, ready: Any
) -> None:
    """The reference path in a process of its own (so the SSE clients' work in the bench
    process does not slow it): ``KafkaAgentClient.stream`` for each turn id it is sent."""

    async def main() -> None:
        async with KafkaAgentClient(bootstrap, prefix=prefix) as client:
            ready.set()
            ids = await asyncio.to_thread(turn_ids.get, True, 300)
            seen: list[Arrival] = []
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
        await read_sse(url, urlsplit(warm.json()["events_url"]).path, asyncio.Event(), [])


def added_per_turn(sse: list[Arrival], client: list[Arrival], since_ms: float) -> list[float]:
    """Per turn, the mean of (SSE lag - client lag) over its events made at or after
    ``since_ms`` that both paths saw."""
    direct = {(t, seq): at for t, seq, ts, at in client if ts >= since_ms}
    per_turn: dict[str, list[float]] = {}
    for turn_id, seq, ts, at in sse:
        other = direct.get((turn_id, seq))
        if ts >= since_ms and other is not None:
            per_turn.setdefault(turn_id, []).append(at - other)
    return [sum(d) / len(d) for d in per_turn.values()]


async def run_gateway(
    bootstrap: str,
    *,
    streams: int,
    model_s: float | None = None,
    open_s: float | None = None,
    keep_topics: bool = False,
) -> dict[str, Any]:
    """The gateway phase (see the module docstring). Streams open over ``open_s`` (default:
    1 s per 1,500 streams); the model takes ``model_s`` per call (default: twice the
    opening plus 10 s, at least 5 s), long enough for every stream to be open before the
    turns' later events are made, also on a busy machine."""
    if open_s is None:
        open_s = streams / 1500
    if model_s is None:
        model_s = max(5.0, 2 * open_s + 10.0)
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
    via_sse: list[Arrival] = []
    via_client: list[Arrival] = []
    retried = 0
    readers: list[Any] = []
    try:
        url = await asyncio.to_thread(url_queue.get, True, 120)
        await asyncio.to_thread(client_ready.wait, 120)
        await _warm_up(url, agent.name)
        assert gateway.pid is not None
        rss_before = _rss_kb(gateway.pid)
        count = reader_count(streams)
        start = time.time() + 1.0  # every reader spawned and imported by then
        slots = [start + i * open_s / streams for i in range(streams)]
        out = context.Queue()
        for r in range(count):
            proc = context.Process(
                target=reader_process,
                args=(url, f"{PREFIX}/{agent.name}/turns", QUESTION, slots[r::count], out),
                name=f"bench-gateway-sse-{r}",
                daemon=True,
            )
            proc.start()
            readers.append(proc)
        turns: list[str] = []
        opened_at: list[float] = []
        while len(opened_at) < count:
            kind, ids, at = await asyncio.to_thread(out.get, True, 600)
            assert kind == "open", kind
            turns += ids
            opened_at.append(at)
        all_open_ms = max(opened_at)
        rss_open = _rss_kb(gateway.pid)
        turn_ids.put(turns)
        for _ in range(count):
            kind, arrivals, retries = await asyncio.to_thread(out.get, True, 600)
            assert kind == "done", kind
            via_sse += arrivals
            retried += retries
        via_client = await asyncio.to_thread(client_arrivals.get, True, 300)
    finally:
        stop.set()
        for proc in (gateway, worker, follower, *readers):
            await asyncio.to_thread(proc.join, 30)
            if proc.is_alive():
                proc.kill()
        if not keep_topics:
            await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))

    def lags(arrivals: list[Arrival]) -> list[float]:
        return [arrived - ts for _, _, ts, arrived in arrivals if ts >= all_open_ms]

    sse, direct = lags(via_sse), lags(via_client)
    added = added_per_turn(via_sse, via_client, all_open_ms)
    from pyrula_stream.gateway.serve import gateway_event_loop

    p = {
        (name, q): round(percentile(values, q), 1)
        for name, values in (("sse", sse), ("client", direct))
        for q in (50, 99)
    }
    return {
        "streams": streams,
        "event_loop": gateway_event_loop(),
        "open_s": round(open_s, 2),
        "model_latency_s": model_s,
        "turns_paired": len(added),
        "sse_reader_processes": reader_count(streams),
        "submit_retries": retried,
        "events_measured_sse": len(sse),
        "events_measured_client": len(direct),
        "sse_p50_ms": p["sse", 50],
        "sse_p99_ms": p["sse", 99],
        "client_p50_ms": p["client", 50],
        "client_p99_ms": p["client", 99],
        "gateway_added_p50_ms": round(percentile(added, 50), 1),
        "gateway_added_p99_ms": round(percentile(added, 99), 1),
        "gateway_kb_per_stream": round((rss_open - rss_before) / streams, 2),
    }


def main() -> None:
    """``python -m pyrula_stream.bench.gateway BOOTSTRAP STREAMS``: this phase alone."""
    import sys

    with contextlib.suppress(KeyboardInterrupt):
        print(json.dumps(asyncio.run(run_gateway(sys.argv[1], streams=int(sys.argv[2])))))


if __name__ == "__main__":
    main()
