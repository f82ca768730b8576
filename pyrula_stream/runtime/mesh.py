"""Several agents in one process: one ``KafkaWorker`` per agent, side by side in one loop;
``run_worker``, the entry point of a worker process, runs one agent or several.

Each agent keeps its own consumer group and transactional producer (a membership is per
agent, so a rebalance of one never pauses another); the mesh only starts them together,
serves one health endpoint for all, and stops them all when one fails or on ``stop()``.
A small deployment runs a whole mesh (a triage agent and the agents it calls) this way.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.errors import ConfigurationError, UserError
from pyrula_stream.kafka.local.bootstrap import find_bootstrap
from pyrula_stream.observability.metrics import merged_exposition
from pyrula_stream.runtime.background import RunsInBackground
from pyrula_stream.runtime.health import start_health_server
from pyrula_stream.runtime.options import WorkerOptions
from pyrula_stream.runtime.worker import KafkaWorker


class MeshWorker(RunsInBackground):
    """Runs the workers of ``agents`` in this event loop; same lifecycle as ``KafkaWorker``."""

    def __init__(
        self,
        agents: Sequence[KafkaAgent],
        *,
        bootstrap_servers: str,
        options: WorkerOptions | None = None,
    ) -> None:
        names = [a.name for a in agents]
        if not names:
            raise ConfigurationError("a mesh worker needs at least one agent")
        if len(set(names)) != len(names):
            raise ConfigurationError(f"agent names repeat in one worker: {sorted(names)}")
        options = options or WorkerOptions()
        if options.group_id is not None and len(agents) > 1:
            raise ConfigurationError(
                "WorkerOptions.group_id names one consumer group, but each agent needs its "
                "own: leave group_id unset when a worker runs several agents"
            )
        self.options = options
        per_agent = dataclasses.replace(options, health_port=None)
        self.workers = [
            KafkaWorker(a, bootstrap_servers=bootstrap_servers, options=per_agent) for a in agents
        ]
        self._started = False

    @property
    def ready(self) -> bool:
        return all(w.ready for w in self.workers)

    @property
    def done(self) -> bool:
        return all(w.done for w in self.workers)

    def worker(self, agent: str) -> KafkaWorker:
        """The worker of one agent (by name)."""
        for w in self.workers:
            if w.agent.name == agent:
                return w
        raise UserError(f"this mesh runs no agent '{agent}'")

    def stop(self) -> None:
        """Ask every worker to stop (drain, commit, leave); safe to repeat."""
        for w in self.workers:
            w.stop()

    async def run(self) -> None:
        """Run every agent's worker until ``stop()``; if one fails, stop the rest and raise."""
        if self._started:
            raise UserError("this mesh worker already ran; create a new one")
        self._started = True
        health = None
        if self.options.health_port is not None:
            health = await start_health_server(
                self.options.health_host,
                self.options.health_port,
                lambda: self.ready,
                metrics=lambda: merged_exposition(w.metrics.registry for w in self.workers),
            )
        tasks = [asyncio.create_task(w.run(), name=f"worker-{w.agent.name}") for w in self.workers]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            self.stop()
            await asyncio.wait(tasks)
            if health is not None:
                health.close()
        for task in tasks:
            task.result()

    async def wait_joined(self) -> None:
        """Return once every worker has joined its group."""
        await asyncio.gather(*(w.wait_joined() for w in self.workers))

    def _task_name(self) -> str:
        return "mesh"


def run_worker(
    agent: KafkaAgent | Sequence[KafkaAgent],
    bootstrap_servers: str | None = None,
    options: WorkerOptions | None = None,
    *,
    handle_signals: bool = True,
    event_loop: str | None = None,
) -> None:
    """Run a worker until SIGTERM/SIGINT (graceful: drain, commit, leave the group).

    Several agents run side by side in this one process (``MeshWorker``). ``event_loop``:
    ``"asyncio"`` (the default) or ``"uvloop"`` (see ``runtime.event_loop``).
    Without ``bootstrap_servers`` it finds the cluster as the CLI does
    (``kafka.local.bootstrap.find_bootstrap``).
    """
    import logging
    import signal

    from pyrula_stream.runtime import event_loop as loops
    from pyrula_stream.runtime.collector import tune_for_worker

    bootstrap = bootstrap_servers or find_bootstrap(options.kafka_config if options else None)

    async def main() -> None:
        worker: KafkaWorker | MeshWorker
        if isinstance(agent, KafkaAgent):
            worker = KafkaWorker(agent, bootstrap_servers=bootstrap, options=options)
        else:
            worker = MeshWorker(agent, bootstrap_servers=bootstrap, options=options)
        if handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, worker.stop)
        tune_for_worker()  # this process is the worker's: its startup objects live on
        logging.getLogger(__name__).info("event loop: %s", loops.loop_in_use())
        await worker.run()

    loops.run(main(), event_loop)
