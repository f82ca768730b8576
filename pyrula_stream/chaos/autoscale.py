"""``--autoscale``: workers scaled on consumer lag as KEDA would, under waves of turns.

Load comes in ``waves`` bursts of ``wave_turns`` turns with a quiet ``gap_s`` between
them; every ``park_every``-th turn parks after its tool call, on a durable timer or on a
signal the harness sends ``signal_after_s`` after its wave (``parking.py``). The
``Scaler`` (``scaler.py``) starts and SIGTERMs worker processes between 1 and
``max_workers`` on the lag of the turns topic, so parked and running turns sit on
partitions that move. Then the topics are read back: the usual counts of ``verify.py``
plus ``autoscale_check.py``'s.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.chaos import verify
from pyrula_stream.chaos.autoscale_check import (
    AUTOSCALE_KEYS,
    check_parked,
    longest_stall,
    signal_payload,
    wave_figures,
)
from pyrula_stream.chaos.broker import run_broker
from pyrula_stream.chaos.effects import AGENT_ENV, EFFECTS_ENV, MODEL_URL_ENV, PARTITIONS_ENV
from pyrula_stream.chaos.harness import GATE_KEYS, ChaosResult
from pyrula_stream.chaos.monitor import EventMonitor
from pyrula_stream.chaos.parking import KINDS, PARK_SIGNAL, PARKS_ENV
from pyrula_stream.chaos.processes import ModelServer, Worker, child_env
from pyrula_stream.chaos.scaler import Scaler, lag, lag_reader
from pyrula_stream.client.kafka_client import KafkaAgentClient
from pyrula_stream.errors import SignalRefused
from pyrula_stream.kafka.admin import DEFAULT_PREFIX, agent_topic_specs, apply_topics
from pyrula_stream.kafka.consumers import read_topic


@dataclass
class AutoscaleConfig:
    waves: int = 4
    wave_turns: int = 80
    wave_rate: float = 40.0
    """Turns per second within a wave."""
    gap_s: float = 30.0
    """Quiet time after each wave's burst: long enough to scale back down to one worker."""
    park_every: int = 5
    """Every this many turns parks (timer and signal in turn)."""
    signal_after_s: float = 8.0
    max_workers: int = 4
    partitions: int = 6
    lag_threshold: int = 5
    """KEDA's ``lagThreshold``: lag per worker."""
    poll_s: float = 2.0
    """KEDA's ``pollingInterval``."""
    cooldown_s: float = 5.0
    """At most one scale-down per this many seconds (the chart's stabilization window)."""
    max_concurrent_turns: int = 4
    """Per worker, so one worker falls behind a burst and the lag builds."""
    min_scale_events: int = 3
    """``scale_ups`` and ``scale_downs`` must each reach this (else ``autoscale_short``)."""
    min_latency_ms: float = 100.0
    max_latency_ms: float = 200.0
    """The model's answer time: slower than the other modes' so a burst outruns one worker."""
    shutdown_grace: float = 10.0
    timeout_s: float = 180.0
    seed: int | None = None
    bootstrap_servers: str | None = None
    run_dir: str | None = None
    keep_run_dir: bool = False
    log: Callable[[str], None] = print

    @classmethod
    def quick(cls, **kw: Any) -> AutoscaleConfig:
        """The small run of the test suite (``--quick``): smaller waves, shorter gaps."""
        return cls(**{"waves": 3, "wave_turns": 50, "gap_s": 22.0, **kw})

    @property
    def turns(self) -> int:
        return self.waves * self.wave_turns


def park_kind(i: int, every: int) -> str:
    """The ``i``-th turn's park: every ``every``-th, timers and signals in turn."""
    if every <= 0 or i % every != every - 1:
        return ""
    return KINDS[(i // every) % len(KINDS)]


class _Load:
    """Submits the waves and sends the signals; what it did, for the checks."""

    def __init__(self, cfg: AutoscaleConfig, bootstrap: str, agent: str) -> None:
        self.cfg = cfg
        self.bootstrap = bootstrap
        self.agent = agent
        self.submitted: list[str] = []
        self.parked: dict[str, str] = {}
        self.waves: list[tuple[float, int]] = []
        self.signals_sent = 0
        self.signal_errors: list[str] = []

    async def run(self) -> None:
        cfg = self.cfg
        async with KafkaAgentClient(self.bootstrap, prefix=DEFAULT_PREFIX, timeout=120.0) as c:
            sends: list[asyncio.Task[None]] = []
            for wave in range(cfg.waves):
                start = time.monotonic()
                self.waves.append((start, cfg.wave_turns))
                waiting: list[str] = []
                for j in range(cfg.wave_turns):
                    delay = start + j / cfg.wave_rate - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    i = wave * cfg.wave_turns + j
                    kind = park_kind(i, cfg.park_every)
                    params: dict[str, Any] = {"n": i, **({"park": kind} if kind else {})}
                    handle = await c.submit(self.agent, **params)
                    self.submitted.append(handle.turn_id)
                    if kind:
                        self.parked[handle.turn_id] = kind
                        if kind == "signal":
                            waiting.append(handle.turn_id)
                sends.append(asyncio.create_task(self._signal(c, waiting)))
                if wave < cfg.waves - 1:
                    await asyncio.sleep(cfg.gap_s)
            await asyncio.gather(*sends)

    async def _signal(self, client: KafkaAgentClient, turns: list[str]) -> None:
        await asyncio.sleep(self.cfg.signal_after_s)
        for turn in turns:
            try:
                await client.signal(
                    self.agent, turn, PARK_SIGNAL, signal_payload(turn), sender="chaos", wait=30.0
                )
                self.signals_sent += 1
            except SignalRefused as exc:
                self.signal_errors.append(f"{turn}: {exc}")


def _check(bootstrap: str, agent: str, run_dir: Path, load: _Load, f: verify.Findings) -> None:
    topics = AgentTopics.for_agent(agent, DEFAULT_PREFIX)
    ids = load.submitted
    events = read_topic(bootstrap, topics.events)
    verify.check_events(ids, events, f)
    view = verify.check_journal(ids, read_topic(bootstrap, topics.journal), f)
    verify.check_model_calls(ids, verify.read_jsonl(str(run_dir / "calls.jsonl")), view, f)
    verify.check_effects(ids, str(run_dir / "effects.jsonl"), view, f)
    f.counts["dead_letters"] = len(read_topic(bootstrap, topics.dlq))
    check_parked(load.parked, events, verify.read_jsonl(str(run_dir / "parks.jsonl")), f)


def run_autoscale(cfg: AutoscaleConfig) -> ChaosResult:
    """Run the whole experiment; never leaves a process behind."""
    started = time.monotonic()
    seed = cfg.seed if cfg.seed is not None else random.randrange(1 << 30)
    run_dir = Path(cfg.run_dir or tempfile.mkdtemp(prefix="pyrula-autoscale-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    agent = f"chaos{uuid.uuid4().hex[:10]}"
    say = cfg.log
    say(
        f"autoscale: {cfg.waves} waves of {cfg.wave_turns} turns, 1..{cfg.max_workers} "
        f"workers on {cfg.partitions} partitions, lag threshold {cfg.lag_threshold}, seed {seed}"
    )
    say(f"agent {agent}; files in {run_dir}")
    f = verify.Findings()
    with run_broker(cfg.bootstrap_servers, restarts=0, brokers=1, run_dir=run_dir) as (boot, _):
        say(f"kafka: {boot}")
        report = apply_topics(boot, agent_topic_specs(agent, partitions=cfg.partitions))
        if not report.ok:
            raise RuntimeError(report.describe())
        server = ModelServer(
            run_dir,
            run_dir / "calls.jsonl",
            min_latency_ms=cfg.min_latency_ms,
            max_latency_ms=cfg.max_latency_ms,
            seed=seed,
        )
        topics = AgentTopics.for_agent(agent, DEFAULT_PREFIX)
        load = _Load(cfg, boot, agent)
        pool: list[Worker] = []
        scaler: Scaler | None = None
        monitor: EventMonitor | None = None
        consumer = lag_reader(boot, f"{DEFAULT_PREFIX}.{agent}.workers")
        try:
            url = server.start_and_wait()
            env = child_env(
                {
                    AGENT_ENV: agent,
                    PARTITIONS_ENV: str(cfg.partitions),
                    MODEL_URL_ENV: url,
                    EFFECTS_ENV: str(run_dir / "effects.jsonl"),
                    PARKS_ENV: str(run_dir / "parks.jsonl"),
                }
            )
            args = ["--max-concurrent-turns", str(cfg.max_concurrent_turns)]
            pool = [
                Worker(
                    i + 1, run_dir, boot, env, shutdown_grace=cfg.shutdown_grace, extra_args=args
                )
                for i in range(min(cfg.max_workers, cfg.partitions))
            ]
            monitor = EventMonitor(boot, topics.events, cfg.partitions)
            monitor.start()
            scaler = Scaler(
                pool,
                lambda: lag(consumer, topics.turns, cfg.partitions),
                threshold=cfg.lag_threshold,
                partitions=cfg.partitions,
                poll_s=cfg.poll_s,
                cooldown_s=cfg.cooldown_s,
                grace_s=cfg.shutdown_grace + 20,
                say=say,
            )
            scaler.step()  # minReplicas: one worker, ready before the first wave
            ready_by = time.monotonic() + 90
            while not pool[0].ready():
                if time.monotonic() > ready_by or not pool[0].alive():
                    raise RuntimeError(
                        f"the first worker did not get ready; see {pool[0].log_path}"
                    )
                time.sleep(0.2)
            scaler.start()
            t0 = time.monotonic()
            asyncio.run(load.run())
            deadline = time.monotonic() + cfg.timeout_s
            mon = monitor
            while not set(load.submitted) <= mon.finished and time.monotonic() < deadline:
                if scaler.errors:
                    raise RuntimeError(f"the scaler failed: {scaler.errors[0]!r}")
                time.sleep(0.5)
            missing = set(load.submitted) - mon.finished
            if missing:
                some = sorted(missing)[:3]
                say(f"TIMEOUT: {len(missing)} turns have no terminal event, e.g. {some}")
            # Let the last scale-downs happen: the run ends on one worker, as KEDA leaves it.
            while len(scaler.running) > 1 and time.monotonic() < deadline + 60:
                time.sleep(0.5)
            scaler.stop()
            say(f"  t={time.monotonic() - t0:6.1f}s {len(mon.finished)} turns ended; SIGTERM")
            for w in list(scaler.running):
                scaler.exit_codes.append(w.stop(cfg.shutdown_grace + 20))
        finally:
            cleanup: list[Callable[[], object]] = []
            if scaler is not None:
                cleanup.append(scaler.stop)
            cleanup += [w.kill for w in pool]
            cleanup += [lambda: server.stop(5), consumer.close]
            if monitor is not None:
                cleanup.append(monitor.stop)
            for step in cleanup:
                try:
                    step()
                except Exception as exc:  # keep cleaning up: no process may be left behind
                    say(f"cleanup step failed: {exc!r}")
        say("reading the topics back (read_committed) and checking ...")
        _check(boot, agent, run_dir, load, f)
    assert scaler is not None and monitor is not None
    events = scaler.events
    ups = sum(1 for e in events if e.kind == "up" and e.detail != "0 -> 1")
    downs = sum(1 for e in events if e.kind == "down")
    short = [
        name
        for name, n, least in (
            ("scale_ups", ups, cfg.min_scale_events),
            ("scale_downs", downs, cfg.min_scale_events),
            ("parked_handed_over", f.counts.get("parked_handed_over", 0), 1),
        )
        if n < least
    ]
    f.counts.update(
        {
            "turns": len(load.submitted),
            "waves": cfg.waves,
            "max_workers": len(pool),
            "lag_threshold": cfg.lag_threshold,
            "scale_ups": ups,
            "scale_downs": downs,
            "autoscale_short": len(short),
            "worker_crashes": len(scaler.crashes),
            "worker_exit_codes": scaler.exit_codes,
            "worker_processes": len(scaler.pids),
            "lag_drained_per_wave": wave_figures(load.waves, scaler.samples, t0),
            "longest_stall_s": longest_stall(scaler.samples, monitor.finish_times),
            "signals_sent": load.signals_sent,
            "lag_read_errors": len(scaler.read_errors),
            "scale_events": [f"t={e.at_s}s {e.kind} {e.detail} lag {e.lag}" for e in events],
            "seed": seed,
            "agent": agent,
            "seconds": round(time.monotonic() - started, 1),
        }
    )
    for name in short:
        f.examples["autoscale_short"].append(f"{name} below its minimum")
    f.examples["worker_crashes"] += scaler.crashes[:5]
    f.examples["parked_not_resumed"] += load.signal_errors[:3]
    result = ChaosResult(
        f.counts,
        dict(f.examples),
        worker_log=verify.worker_log_digest(sorted(run_dir.glob("worker-*.log"))),
    )
    f.counts["run_dir"] = str(run_dir)
    if result.ok and not cfg.keep_run_dir and cfg.run_dir is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        f.counts["run_dir"] = None
    return result


def autoscale_summary(result: ChaosResult) -> str:
    """The human part of an ``--autoscale`` run's output (the JSON line follows it)."""
    c = result.counts
    lines = ["", "== autoscale summary =="]
    lines.append(
        f"{c['turns']} turns in {c['waves']} waves, {c['parked_turns']} parked "
        f"{c['parked_by_kind']}, {c['signals_sent']} signals; workers 1..{c['max_workers']} "
        f"(lag threshold {c['lag_threshold']}), {c['worker_processes']} worker processes, "
        f"{c['seconds']}s"
    )
    lines += [f"  {e}" for e in c["scale_events"]]
    lines += [f"  wave {w}" for w in c["lag_drained_per_wave"]]
    lines.append(
        f"scale_ups {c['scale_ups']}, scale_downs {c['scale_downs']}, parked_handed_over "
        f"{c['parked_handed_over']}, longest stall (lag > 0, no turn ending) "
        f"{c['longest_stall_s']}s; exit codes after SIGTERM {c['worker_exit_codes']}"
    )
    gated = (*GATE_KEYS, *AUTOSCALE_KEYS)
    for key in (*gated, "seq_gaps", "journal_gaps", "failed_turns", "wrong_results",
                "missing_effects", "dead_letters", "repeated_llm_before_commit"):  # fmt: skip
        n = c.get(key, 0)
        mark = "FAIL" if key in gated and n else ("note" if n else " ok ")
        lines.append(f"[{mark}] {key:<28} {n:>5}")
        lines += [f"         e.g. {e}" for e in result.examples.get(key, [])[:3]]
    if result.worker_log:
        lines.append("worker log warnings/errors (count, line with numbers masked):")
        lines += [f"  {n:>4} {text}" for n, text in result.worker_log[:12]]
    if c.get("run_dir"):
        lines.append(f"run files kept in {c['run_dir']}")
    failed = [k for k in gated if c.get(k, 1)]
    lines.append("PASS" if result.ok else "FAIL: " + ", ".join(failed))
    return "\n".join(lines)
