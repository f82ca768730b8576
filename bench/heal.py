"""How long a worker takes to commit turns again after a network partition between it
and its broker heals.

Every client reaches the broker through a TCP proxy here (``chaos.partition``; the broker
advertises the proxy's port). For ``--outage`` seconds, while a client keeps submitting turns, the
partition is one of (``--mode``):

- ``cut``: the proxy drops every open connection and holds new ones without an answer
  (a partition that resets connections, like a restarting broker or a failing switch);
- ``freeze``: the broker JVM is stopped with SIGSTOP (connections stay open, nothing
  answers: a blackhole), then continued with SIGCONT.

Reported: seconds from the heal until a turn submitted at the heal has its
``run:complete`` (a fresh client, so the figure is the worker's recovery plus one turn),
and what the worker logged about its producer.

    .venv/bin/python bench/heal.py --outage 5 10 15
    .venv/bin/python bench/heal.py --code /tmp/base   # another checkout's worker code
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyrula_stream.chaos.partition import PartitionProxy
from pyrula_stream.client.kafka_client import KafkaAgentClient
from pyrula_stream.kafka.local.broker import LocalBroker, free_port, start_local_broker
from pyrula_stream.testing import agent_topics_ready, unique_name

ROOT = Path(__file__).parent.parent


async def _load(client: KafkaAgentClient, agent: str, stop: asyncio.Event) -> None:
    """Turns submitted back to back, so a transaction is in flight when the broker stops."""
    while not stop.is_set():
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.submit(agent, text="load"), 5)
        await asyncio.sleep(0.05)


async def _measure(
    bootstrap: str,
    broker: LocalBroker,
    proxy: PartitionProxy,
    agent: str,
    outage_s: float,
    mode: str,
) -> float:
    async with KafkaAgentClient(bootstrap, timeout=60) as client:
        await client.run(agent, text="warm up", timeout=120)
        stop = asyncio.Event()
        load = asyncio.create_task(_load(client, agent, stop))
        await asyncio.sleep(3)
        if mode == "cut":
            proxy.cut()
        else:
            os.killpg(broker.pid, signal.SIGSTOP)
        await asyncio.sleep(outage_s)
        if mode == "cut":
            proxy.heal()
        else:
            os.killpg(broker.pid, signal.SIGCONT)
        healed = time.monotonic()
        stop.set()
    for attempt in range(5):  # a client's own first reads can fail right after a heal
        try:
            async with KafkaAgentClient(bootstrap, timeout=120) as fresh:
                events = await fresh.run(agent, text="after the outage", timeout=300)
            break
        except Exception as exc:
            print(f"client attempt {attempt + 1} failed: {exc!r}", file=sys.stderr)
            await asyncio.sleep(0.2)
    took = time.monotonic() - healed
    load.cancel()
    with contextlib.suppress(BaseException):
        await load
    assert events[-1].type == "run:complete", events[-1]
    return took


def run_one(code: Path, outage_s: float, mode: str) -> dict[str, object]:
    agent = unique_name("heal")
    with tempfile.TemporaryDirectory(prefix="pyrula-heal-") as tmp:
        port, health = free_port(), free_port()
        proxy = PartitionProxy(free_port(), port)
        broker = start_local_broker(
            data_dir=Path(tmp) / "kafka", port=port, advertised_port=proxy.port
        )
        bootstrap = proxy.bootstrap_servers
        log_path = Path(tmp) / "worker.log"
        with open(log_path, "wb") as log_file:
            worker = subprocess.Popen(
                [
                    *(sys.executable, "-m", "pyrula_stream.cli"),
                    *("worker", "tests.agents.echo:echo"),
                    *("--bootstrap-servers", bootstrap),
                    *("--health-port", str(health), "--worker-id", "heal-1"),
                ],
                cwd=code,
                env={**os.environ, "PYTHONPATH": str(code), "ECHO_AGENT_NAME": agent},
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        try:
            asyncio.run(agent_topics_ready(bootstrap, agent))
            took = asyncio.run(_measure(bootstrap, broker, proxy, agent, outage_s, mode))
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(60)
            finally:
                worker.kill()
                broker.stop()
                proxy.close()
        log = log_path.read_text()
    return {
        "mode": mode,
        "outage_s": outage_s,
        "heal_to_turn_complete_s": round(took, 1),
        "session_restarts": log.count("dropping turns and rejoining"),
        "producer_replaced_in_place": log.count("replaced the transactional producer"),
        "gave_up_after_heal": log.count("after Kafka answered again"),
        "gave_up_at_timeout": log.count("did not return within"),
        "worker_said": [
            line.split(" ", 3)[-1][:200]
            for line in log.splitlines()
            if any(w in line for w in ("pyrula_stream.runtime", "pyrula_stream.kafka"))
        ][:8],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage", type=float, nargs="+", default=[5.0, 10.0, 15.0])
    parser.add_argument("--mode", choices=["cut", "freeze"], default="cut")
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout whose worker runs")
    args = parser.parse_args()
    for outage in args.outage:
        result = run_one(args.code, outage, args.mode)
        print(json.dumps({"code": str(args.code), **result}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
