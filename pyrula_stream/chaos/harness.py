"""A chaos run: broker, model server, W workers, N turns, K SIGKILLs, then the checks.

Setup is that of ``make test``: a local broker is started unless one is given. Each run
uses a fresh agent name, so its topics, consumer group and transactional ids are its own
and reruns on one broker never mix. Turns are submitted at a steady rate and the kills
are spread over that window (see ``monkey.py``). When every turn has a terminal event (or
the timeout says which have not), the workers get SIGTERM, and everything is checked from
the outside (see ``verify.py``). With ``broker_restarts`` the harness runs its own broker
and stops and restarts it mid-run (see ``broker.py``); with ``secured``, its own SASL broker
with the agent's generated ACLs, each part connecting as its role (see ``secured.py``). No
process is left behind, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.chaos import hostile, hostile_caps_check, hostile_check, verify
from pyrula_stream.chaos.answer_kills import AnswerKiller, check_answer_kills
from pyrula_stream.chaos.approvals import APPROVAL_KEYS, Reviewer, check_approvals, read_answers
from pyrula_stream.chaos.autoscale_check import AUTOSCALE_KEYS
from pyrula_stream.chaos.batch_lane import (
    BATCH_KEYS,
    BATCH_URL_ENV,
    MIN_KILLS_DURING_BATCHES,
    BatchKiller,
    BatchProvider,
    check_batches,
)
from pyrula_stream.chaos.broker import BrokerRestart, BrokerRestarter, OwnBroker, run_broker
from pyrula_stream.chaos.cluster import ClusterKiller, cluster_counts
from pyrula_stream.chaos.effects import (
    AGENT_ENV,
    APPROVALS_ENV,
    EFFECTS_ENV,
    GATED_EFFECTS_ENV,
    HOSTILE_ENV,
    MODEL_URL_ENV,
    PARTITIONS_ENV,
    SUBAGENTS_ENV,
)
from pyrula_stream.chaos.hostile import Context, HostileSender
from pyrula_stream.chaos.hostile_record import KINDS as HOSTILE_KINDS
from pyrula_stream.chaos.hostile_settle import settle_hostile
from pyrula_stream.chaos.large import (
    KILL_SHARE,
    LARGE_ENV,
    LARGE_KEYS,
    MIN_LARGE_TURNS,
    check_large,
    large_params,
)
from pyrula_stream.chaos.monitor import EventMonitor, replies_watch
from pyrula_stream.chaos.monkey import KillRecord, Monkey, kill_plan
from pyrula_stream.chaos.processes import AGENT_SPEC, CHILD_SPEC, ModelServer, Worker, child_env
from pyrula_stream.chaos.secured import (
    CLIENT,
    ROLES,
    WORKER,
    SecuredBroker,
    check_secured,
    secured_broker,
    shared_topic_specs,
)
from pyrula_stream.chaos.tenants import (
    KILL_WINDOW_EXTRA_S,
    TENANT_KEYS,
    TENANTS_ENV,
    check_tenants,
    tenant_for,
)
from pyrula_stream.client.kafka_client import KafkaAgentClient
from pyrula_stream.kafka.admin import DEFAULT_PREFIX, agent_topic_specs, apply_topics
from pyrula_stream.kafka.consumers import read_topic
from pyrula_stream.kafka.local.cluster import LocalCluster
from pyrula_stream.objects.s3_server import local_s3
from pyrula_stream.objects.urls import OBJECT_STORE_ENV
from pyrula_stream.runtime.committer import CHAOS_KILL_ENV
from pyrula_stream.runtime.options import WorkerOptions

GATE_KEYS = (
    "lost",
    "duplicate_terminal",
    "duplicate_events",
    "repeated_llm_after_journal",
    "duplicate_effects",
)
THREAD_GATE_KEYS = ("thread_turns_missing", "thread_turns_doubled")
"""Gated too when the run spreads its turns over threads (``--threads``)."""


CHAOS_BUCKET = "pyrula-chaos"
"""``--large-store s3``: the bucket on the run's own S3 server."""


@dataclass
class ChaosConfig:
    turns: int = 300
    workers: int = 3
    kills: int = 8
    broker_restarts: int = 0
    """Times the broker is stopped (the first with SIGKILL) and restarted mid-run."""
    brokers: int = 1
    """``--brokers 3``: the harness runs its own cluster of that many brokers."""
    broker_kills: int = 0
    """Brokers SIGKILLed one at a time on that cluster, then one rolling restart."""
    seed: int | None = None
    bootstrap_servers: str | None = None
    partitions: int = 6
    rate: float = 5.0
    """Turns submitted per second; the kills are spread over the submission window."""
    timeout_s: float = 180.0
    """How long to wait for the last terminal events after the last submission."""
    shutdown_grace: float = 10.0
    min_latency_ms: float = 20.0
    max_latency_ms: float = 50.0
    fast_takeover: bool = False
    """Workers use static membership: a restarted worker gets its partitions back at once."""
    group_protocol: str = "classic"
    turns_per_thread: int = 0
    """``--threads``: turns spread over threads of about this many turns (0: no threads)."""
    run_dir: str | None = None
    keep_run_dir: bool = False
    log: Callable[[str], None] = print
    subagents: bool = False
    """Each turn also calls two children on a second agent (both agents in every worker)."""
    hostile: int = 0
    """``--hostile``: this many generated hostile records go out among the valid turns."""
    hostile_kinds: tuple[str, ...] = HOSTILE_KINDS
    """``--hostile-kinds``: the kinds they are drawn from (each about as often)."""
    hostile_settle_s: float = 60.0
    """How long to wait, after the last valid turn, for the hostile records' outcomes."""
    approvals: bool = False
    """``--approvals``: each turn makes one gated call that a reviewer thread answers."""
    tenants: bool = False
    """``--tenants``: turns spread over three tenants with small quotas (``tenants.py``)."""
    secured: bool = False
    """``--secured``: the harness's own SASL_SSL broker with the generated ACLs; workers,
    submitter and forged answers each connect as their role (``secured.py``)."""
    large: bool = False
    """``--large``: large values by reference, kills between object write and commit
    (``large.py``)."""
    large_store: str = "local"
    """``--large-store s3``: the store is a real S3 server on loopback
    (``objects/s3_server``), not a local directory."""
    batch: bool = False
    """``--batch``: the model calls go by the batch lane to a provider process of their
    own (``batch_lane.py``)."""


@dataclass
class ChaosResult:
    counts: dict[str, Any]
    examples: dict[str, list[str]]
    kills: list[KillRecord] = field(default_factory=list)
    broker_restarts: list[BrokerRestart] = field(default_factory=list)
    worker_log: list[tuple[int, str]] = field(default_factory=list)
    """Distinct warning/error lines of the workers' logs (count, text), most frequent first."""

    @property
    def ok(self) -> bool:
        gated = GATE_KEYS + (THREAD_GATE_KEYS if "thread_turns_missing" in self.counts else ())
        if "hostile_not_in_dlq" in self.counts:
            gated += hostile_check.HOSTILE_KEYS
        if "approved_not_run" in self.counts:
            gated += APPROVAL_KEYS
        if "quota_overshoot" in self.counts:
            gated += TENANT_KEYS
        if "parked_not_resumed" in self.counts:
            gated += AUTOSCALE_KEYS
        if "dangling_refs" in self.counts:
            gated += LARGE_KEYS
            if self.counts.get("large_turns", 0) < MIN_LARGE_TURNS:
                return False
            if self.counts.get("kills_after_objects", 0) < 1:
                return False
        if "batch_calls_submitted_twice" in self.counts:
            gated += BATCH_KEYS
            if self.counts.get("kills_during_batches", 0) < MIN_KILLS_DURING_BATCHES:
                return False
        # A tenants run proves something only if the quotas really deferred turns.
        tenants_ok = "quota_overshoot" not in self.counts or self.counts.get("deferrals", 0) >= 1
        subagents_ok = all(self.counts.get(k, 0) == 0 for k in verify.SUBAGENT_KEYS)
        # Broker kills prove something only if leaders and a coordinator really moved.
        cluster_ok = not self.counts.get("broker_kills") or all(
            self.counts.get(k, 0) >= 1 for k in ("leader_changes_seen", "coordinator_moves_seen")
        )
        return (
            tenants_ok
            and subagents_ok
            and cluster_ok
            and all(self.counts.get(k, 1) == 0 for k in gated)
        )


async def submit_all(
    bootstrap: str,
    agent: str,
    turns: int,
    rate: float,
    submitted: list[str],
    threads: dict[str, list[str]] | None = None,
    per_thread: int = 0,
    tenants: bool = False,
    kafka_config: Mapping[str, Any] | None = None,
    object_store: str | None = None,
) -> None:
    """Submit ``turns`` turns with ``KafkaAgentClient`` at ``rate`` per second; with
    ``per_thread``, round-robin over ``turns / per_thread`` threads (in ``threads``); with
    ``tenants``, round-robin over the tenants of ``tenants.py``. ``kafka_config``: the
    client principal's settings on a secured run.

    The timeout outlasts a broker restart: a submit waits for the broker to come back.
    """
    count = max(1, -(-turns // per_thread)) if per_thread else 0
    async with KafkaAgentClient(
        bootstrap,
        prefix=DEFAULT_PREFIX,
        timeout=120.0,
        kafka_config=kafka_config,
        object_store=object_store,
    ) as client:
        start = time.monotonic()
        for i in range(turns):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            thread_id = f"thread-{i % count}" if count else None
            metadata = {"tenant": tenant_for(i)} if tenants else None
            extra = large_params(i) if object_store is not None else {}
            handle = await client.submit(
                agent, n=i, thread_id=thread_id, metadata=metadata, **extra
            )
            if thread_id is not None and threads is not None:
                threads.setdefault(thread_id, []).append(handle.turn_id)
            submitted.append(handle.turn_id)


def _wait_ready(workers: list[Worker], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(w.ready() for w in workers):
        dead = [w for w in workers if not w.alive()]
        if dead:
            tail = dead[0].log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"worker {dead[0].worker_id} exited at start:\n{tail}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers not ready after {timeout_s}s")
        time.sleep(0.1)


class _Run:
    """The state of one run, so that ``run_chaos`` stays a readable sequence."""

    def __init__(
        self,
        cfg: ChaosConfig,
        bootstrap: str,
        agent: str,
        run_dir: Path,
        secured: SecuredBroker | None = None,
    ) -> None:
        self.cfg = cfg
        self.bootstrap = bootstrap
        self.secured = secured
        self.admin = secured.admin if secured is not None else None
        """The harness's own readers' settings: the super user's on a secured run."""
        self.client = secured.settings(CLIENT) if secured is not None else None
        self.agent = agent
        self.topics = AgentTopics.for_agent(agent, DEFAULT_PREFIX)
        self.calls = run_dir / "calls.jsonl"
        self.effects = run_dir / "effects.jsonl"
        self.run_dir = run_dir
        self.submitted: list[str] = []
        self.threads: dict[str, list[str]] = {}
        self.crashes: list[str] = []
        self.stop_codes: dict[str, int | None] = {}
        self.lock = threading.Lock()
        self.say = cfg.log
        self.hostile: HostileSender | None = None
        self.reviewer: Reviewer | None = None
        self.killer: AnswerKiller | None = None
        self.batch_killer: BatchKiller | None = None
        self.kills: list[KillRecord] = []
        """The monkey's kills (what ``--batch`` checks against the batches' lives)."""
        self.batch_log = run_dir / "batch-calls.jsonl"
        self.control_skips: dict[str, int] = {}
        """Each worker's count of skipped control records once the hostile ones settled."""
        self.store_dir = run_dir / "objects"
        """``--large``: the workers' and submitter's local object store."""
        self.store_setting = str(self.store_dir)
        """``--large``: the store's setting every part uses (a directory, or an ``s3://``
        URL with ``--large-store s3``)."""
        self.self_kills = 0
        """``--large``: workers that killed themselves between object write and commit."""

    def finished(self, monitor: EventMonitor) -> bool:
        return len(self.submitted) == self.cfg.turns and set(self.submitted) <= monitor.finished

    def drive(
        self,
        workers: list[Worker],
        monitor: EventMonitor,
        monkey: Monkey,
        restarter: BrokerRestarter | ClusterKiller | None,
    ) -> float:
        """Submit the turns and wait for their ends; returns when submission started."""
        cfg = self.cfg
        errors: list[BaseException] = []

        def submitter() -> None:
            try:
                asyncio.run(
                    submit_all(
                        self.bootstrap,
                        self.agent,
                        cfg.turns,
                        cfg.rate,
                        self.submitted,
                        self.threads,
                        cfg.turns_per_thread,
                        cfg.tenants,
                        self.client,
                        self.store_setting if cfg.large else None,
                    )
                )
            except BaseException as exc:
                errors.append(exc)

        sub = threading.Thread(target=submitter, name="chaos-submitter", daemon=True)
        t0 = time.monotonic()
        monkey.start()
        if restarter is not None:
            restarter.start()
        sub.start()
        if self.hostile is not None:
            self.hostile.start()
        last_note, deadline = 0.0, None
        while not self.finished(monitor):
            now = time.monotonic()
            if errors:
                raise RuntimeError(f"submitting turns failed: {errors[0]!r}")
            if deadline is None and not sub.is_alive():
                deadline = now + cfg.timeout_s
            if deadline is not None and now > deadline:
                missing = sorted(set(self.submitted) - monitor.finished)
                self.say(
                    f"TIMEOUT: {len(missing)} turns have no terminal event "
                    f"{cfg.timeout_s}s after the last submission, e.g. {missing[:3]}"
                )
                break
            self._restart_crashed(workers, now - t0)
            if now - last_note >= 5:
                last_note = now
                hostile = f", hostile {len(self.hostile.sent)}" if self.hostile else ""
                self.say(
                    f"  t={now - t0:6.1f}s submitted {len(self.submitted)}/{cfg.turns}, "
                    f"finished {len(monitor.finished)}, kills {len(monkey.kills)}{hostile}"
                )
            time.sleep(0.1)
        monkey.stop()
        if restarter is not None:
            restarter.wait_idle()  # the workers stop, and the topics are read, with a broker
        sub.join(5)
        if self.hostile is not None:
            self.control_skips = settle_hostile(
                self.hostile,
                self.bootstrap,
                self.agent,
                workers,
                self.run_dir,
                self.cfg.hostile_settle_s,
                lambda: self._restart_crashed(workers, time.monotonic() - t0),
                self.say,
                kafka_config=self.admin,
            )
        return t0

    def _restart_crashed(self, workers: list[Worker], at: float) -> None:
        """A worker that exited without being killed by us is a finding; restart it."""
        with self.lock:
            for w in workers:
                if not w.alive():
                    code = w.proc.returncode if w.proc is not None else None
                    if self.cfg.large and code == -9:  # its own kill point: not a crash
                        self.self_kills += 1
                        self.say(f"  t={at:6.1f}s {w.worker_id} killed itself after objects")
                        w.kill()
                        w.start()
                        continue
                    self.crashes.append(f"t={at:.1f}s {w.worker_id} pid {w.pid} exited {code}")
                    self.say(
                        f"  t={at:6.1f}s {w.worker_id} EXITED on its own ({code}); "
                        f"restarting it (log: {w.log_path})"
                    )
                    w.kill()
                    w.start()

    def stop_workers(self, workers: list[Worker]) -> None:
        """SIGTERM all workers at once; record each exit code (None: had to SIGKILL)."""

        def stop(w: Worker) -> None:
            self.stop_codes[w.worker_id] = w.stop(self.cfg.shutdown_grace + 20)

        threads = [threading.Thread(target=stop, args=(w,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def read(self, topic: str) -> list[verify.Record]:
        """Every committed record of ``topic``, read as the harness (a super user)."""
        return read_topic(self.bootstrap, topic, kafka_config=self.admin)

    def check(self) -> verify.Findings:
        f = verify.Findings()
        ids = self.submitted
        events = self.read(self.topics.events)
        verify.check_events(ids, events, f)
        if self.cfg.turns_per_thread:
            threads = self.read(self.topics.threads)
            verify.check_threads(self.threads, events, threads, f)
        journal = self.read(self.topics.journal)
        view = verify.check_journal(ids, journal, f)
        calls = verify.read_jsonl(str(self.calls))
        if self.cfg.batch:
            provider = verify.read_jsonl(str(self.batch_log))
            calls += check_batches(ids, journal, events, provider, self.kills, f)
        verify.check_model_calls(ids, calls, view, f)
        verify.check_effects(ids, str(self.effects), view, f)
        dlq = self.read(self.topics.dlq)
        f.counts["dead_letters"] = len(dlq)
        if self.cfg.large:
            check_large(
                self.topics,
                self.read,
                self.bootstrap,
                self.store_setting,
                self.self_kills,
                f,
                kafka_config=self.admin,
            )
        if self.hostile is not None:
            logs = sorted(self.run_dir.glob("worker-*.log"))
            hostile_check.check_hostile(self.hostile.sent, dlq, events, journal, logs, f)
            hostile_check.check_control_counts(self.hostile.sent, self.control_skips, f)
            usage = self.read(self.topics.tenant_usage)
            gated = str(self.run_dir / "gated-effects.jsonl")
            hostile_caps_check.check_caps(
                self.hostile.sent, ids, dlq, events, journal, usage, gated, self.cfg.workers, f
            )
            for error in self.hostile.errors[:3]:
                f.add("hostile_not_in_dlq", 0, example=f"not sent: {error}")
        if self.reviewer is not None:
            answers = read_answers(self.run_dir / "answers.jsonl")
            gated = str(self.run_dir / "gated-effects.jsonl")
            check_approvals(ids, events, journal, answers, gated, self.reviewer.errors, f)
            if self.killer is not None:
                check_answer_kills(self.killer.kills, events, gated, f, self.killer.errors)
        if self.cfg.tenants:
            usage = self.read(self.topics.tenant_usage)
            slots = WorkerOptions().max_concurrent_turns  # the chaos workers' default
            check_tenants(ids, events, usage, self.cfg.workers, slots, f)
        if self.cfg.subagents:
            child = AgentTopics.for_agent(f"{self.agent}-child", DEFAULT_PREFIX)
            verify.check_subagents(
                ids,
                self.read(self.topics.events),
                self.read(child.turns),
                self.read(child.events),
                # Hostile replies are checked by hostile_check, not counted as children's.
                [r for r in self.read(self.topics.replies) if hostile.KIND_HEADER not in r.headers],
                f,
            )
        return f


def run_chaos(cfg: ChaosConfig) -> ChaosResult:
    """Run the whole experiment; never leaves a process behind."""
    started = time.monotonic()
    seed = cfg.seed if cfg.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    run_dir = Path(cfg.run_dir or tempfile.mkdtemp(prefix="pyrula-chaos-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    agent = f"chaos{uuid.uuid4().hex[:10]}"
    say = cfg.log
    say(
        f"chaos: {cfg.turns} turns, {cfg.workers} workers, {cfg.kills} kills, "
        f"{cfg.broker_restarts} broker restarts, seed {seed}"
    )
    say(f"agent {agent}; files in {run_dir}")
    restarter: BrokerRestarter | ClusterKiller | None = None
    secured: SecuredBroker | None = None
    own: OwnBroker | LocalCluster | None = None
    with contextlib.ExitStack() as after_check:
        if cfg.secured:
            check_secured(
                bootstrap_servers=cfg.bootstrap_servers,
                broker_restarts=cfg.broker_restarts,
                brokers=cfg.brokers,
                subagents=cfg.subagents,
                approvals=cfg.approvals,
            )
            secured = after_check.enter_context(secured_broker(run_dir))
            bootstrap = secured.bootstrap
        else:
            bootstrap, own = after_check.enter_context(
                run_broker(
                    cfg.bootstrap_servers,
                    restarts=cfg.broker_restarts,
                    brokers=cfg.brokers,
                    run_dir=run_dir,
                )
            )
        say(f"kafka: {bootstrap}{' (SASL_SSL, generated ACLs)' if secured else ''}")
        run = _Run(cfg, bootstrap, agent, run_dir, secured)
        if cfg.large and cfg.large_store == "s3":  # its AWS_* reach every worker's env
            s3 = after_check.enter_context(local_s3(CHAOS_BUCKET))
            run.store_setting = s3.store_url(CHAOS_BUCKET, f"{agent}/")
            say(f"object store: S3 at {s3.endpoint_url} (versitygw)")
        # A hostile run's agent has tenants (invented ones among them): their topics too.
        tenants = cfg.tenants or bool(cfg.hostile)
        specs = agent_topic_specs(agent, partitions=cfg.partitions, tenants=tenants)
        if cfg.subagents:
            specs += agent_topic_specs(f"{agent}-child", partitions=cfg.partitions)
        if secured is not None:
            specs += shared_topic_specs()
        report = apply_topics(bootstrap, specs, kafka_config=run.admin)
        if not report.ok:
            raise RuntimeError(report.describe())
        if secured is not None:
            granted = secured.grant(agent, tenants=tenants)
            say(f"ACLs: {granted} rules for {', '.join(ROLES)}")
        server = ModelServer(
            run_dir,
            run.calls,
            min_latency_ms=cfg.min_latency_ms,
            max_latency_ms=cfg.max_latency_ms,
            seed=seed,
        )
        provider = BatchProvider(run_dir, run.batch_log) if cfg.batch else None
        workers: list[Worker] = []
        monitor: EventMonitor | None = None
        monkey: Monkey | None = None
        try:
            url = server.start_and_wait()
            say(f"model server: {url} (pid {server.pid})")
            batch_url = provider.start_and_wait() if provider is not None else ""
            if provider is not None:
                say(f"batch provider: {batch_url} (pid {provider.pid})")
            env = child_env(
                {
                    AGENT_ENV: agent,
                    PARTITIONS_ENV: str(cfg.partitions),
                    MODEL_URL_ENV: url,
                    EFFECTS_ENV: str(run.effects),
                    SUBAGENTS_ENV: "1" if cfg.subagents else "0",
                    APPROVALS_ENV: "1" if cfg.approvals else "0",
                    TENANTS_ENV: "1" if cfg.tenants else "0",
                    HOSTILE_ENV: "1" if cfg.hostile else "0",
                    GATED_EFFECTS_ENV: str(run_dir / "gated-effects.jsonl"),
                    **(
                        {
                            LARGE_ENV: "1",
                            OBJECT_STORE_ENV: run.store_setting,
                            CHAOS_KILL_ENV: str(KILL_SHARE),
                        }
                        if cfg.large
                        else {}
                    ),
                    BATCH_URL_ENV: batch_url,
                }
            )
            worker_args = ["--group-protocol", cfg.group_protocol]
            if cfg.fast_takeover:
                worker_args.append("--static-membership")
            if secured is not None:
                worker_args += ["--kafka-config", str(secured.properties_file(WORKER))]
            specs_run = (AGENT_SPEC, CHILD_SPEC) if cfg.subagents else (AGENT_SPEC,)
            workers = [
                Worker(
                    i + 1,
                    run_dir,
                    bootstrap,
                    env,
                    shutdown_grace=cfg.shutdown_grace,
                    extra_args=worker_args,
                    specs=specs_run,
                )
                for i in range(cfg.workers)
            ]
            for w in workers:
                w.start()
            _wait_ready(workers, 90)
            say(f"workers ready: {', '.join(f'{w.worker_id} (pid {w.pid})' for w in workers)}")
            monitor = EventMonitor(
                bootstrap, run.topics.events, cfg.partitions, kafka_config=run.admin
            )
            monitor.start()
            mon = monitor
            if cfg.hostile:
                run.hostile = HostileSender(
                    bootstrap,
                    Context(
                        agent,
                        cfg.partitions,
                        agent.removeprefix("chaos"),
                        run.submitted.copy,
                        secured=secured is not None,
                    ),
                    cfg.hostile,
                    max(cfg.turns / cfg.rate, 2.0),
                    random.Random(f"{seed}-hostile"),
                    cfg.hostile_kinds,
                    kafka_config=run.admin,
                    client_config=run.client,
                )
            # Deferred turns start in later minutes: with tenants the kills reach them too.
            kill_window = max(cfg.turns / cfg.rate, 2.0) + (
                KILL_WINDOW_EXTRA_S if cfg.tenants else 0
            )
            plan = kill_plan(cfg.kills, kill_window, rng, after_reply=cfg.subagents)
            monkey = Monkey(
                workers,
                plan,
                run.effects,
                rng,
                lambda: run.finished(mon),
                say,
                run.lock,
                replies=replies_watch(bootstrap, run.topics.replies, cfg.partitions)
                if cfg.subagents
                else None,
            )
            if cfg.batch:
                run.batch_killer = BatchKiller(
                    bootstrap, agent, cfg.partitions, monkey, random.Random(f"{seed}-b"),
                    lambda: run.finished(mon),
                )  # fmt: skip
                run.batch_killer.start()
            if cfg.approvals:
                run.killer = AnswerKiller(
                    bootstrap, agent, cfg.partitions, monkey, random.Random(f"{seed}-k"),
                    lambda: run.finished(mon),
                )  # fmt: skip
                run.killer.start()
                run.reviewer = Reviewer(
                    bootstrap, agent, run_dir / "answers.jsonl", random.Random(f"{seed}-r"), say,
                    killer=run.killer,
                )  # fmt: skip
                run.reviewer.start()
            if isinstance(own, LocalCluster):
                window = max(cfg.turns / cfg.rate, 2.0)
                planned = cfg.broker_kills
                restarter = ClusterKiller(
                    own,
                    [window * (i + 0.3) / max(1, planned) for i in range(planned)],
                    topics=[run.topics.turns, run.topics.journal, run.topics.events],
                    transactional_ids=[f"pyrula.{agent}.{w.worker_id}" for w in workers],
                    group_id=f"pyrula.{agent}.workers",
                    all_done=lambda: run.finished(mon),
                    log=say,
                    rng=random.Random(seed),
                )
                after_check.callback(restarter.stop)
            elif isinstance(own, OwnBroker):
                window = max(cfg.turns / cfg.rate, 2.0)
                restarts = cfg.broker_restarts
                restarter = BrokerRestarter(
                    own,
                    [window * (i + 0.3) / restarts for i in range(restarts)],
                    lambda: run.finished(mon),
                    say,
                )
                after_check.callback(restarter.stop)
            t0 = run.drive(workers, monitor, monkey, restarter)
            end = time.monotonic()
            stall, stall_at = monitor.longest_stall(t0, end)
            say(f"  t={end - t0:6.1f}s {len(monitor.finished)} turns ended; SIGTERM to workers")
            run.stop_workers(workers)
        finally:
            cleanup: list[Callable[[], object]] = []
            if monkey is not None:
                cleanup.append(monkey.stop)
            if run.reviewer is not None:
                cleanup.append(run.reviewer.stop)
            if run.killer is not None:
                cleanup.append(run.killer.stop)
            if run.batch_killer is not None:
                cleanup.append(run.batch_killer.stop)
            cleanup += [w.kill for w in workers]
            cleanup.append(lambda: server.stop(5))
            if provider is not None:
                cleanup.append(lambda: provider.stop(5))
            if monitor is not None:
                cleanup.append(monitor.stop)
            for step in cleanup:
                try:
                    step()
                except Exception as exc:  # keep cleaning up: no process may be left behind
                    say(f"cleanup step failed: {exc!r}")
        say("reading the topics back (read_committed) and checking ...")
        run.kills = monkey.kills if monkey is not None else []
        f = run.check()
    kills = monkey.kills if monkey is not None else []
    f.counts.update(
        {
            "turns": len(run.submitted),
            "workers": cfg.workers,
            "kills": len(kills),
            "kills_after_effect": sum(1 for k in kills if k.kind == "after_effect"),
            "kills_after_reply": sum(1 for k in kills if k.kind == "after_reply"),
            "broker_restarts": len(restarter.restarts)
            if isinstance(restarter, BrokerRestarter)
            else 0,
            **cluster_counts(restarter),
            "worker_crashes": len(run.crashes),
            "worker_exit_codes": run.stop_codes,
            "longest_stall_s": stall,
            "longest_stall_at_s": stall_at,
            "fast_takeover": cfg.fast_takeover,
            "group_protocol": cfg.group_protocol,
            "secured": cfg.secured,
            "seed": seed,
            "agent": agent,
            "seconds": round(time.monotonic() - started, 1),
        }
    )
    f.counts["worker_crashes"] += len(monkey.found_dead) if monkey is not None else 0
    for crash in [*run.crashes, *(monkey.found_dead if monkey is not None else [])][:5]:
        f.examples["worker_crashes"].append(crash)
    if restarter is not None and restarter.error is not None:
        raise RuntimeError(f"restarting the broker failed: {restarter.error!r}")
    result = ChaosResult(
        f.counts,
        dict(f.examples),
        kills,
        restarter.restarts if restarter is not None else [],
        verify.worker_log_digest(sorted(run_dir.glob("worker-*.log"))),
    )
    f.counts["run_dir"] = str(run_dir)
    if result.ok and not cfg.keep_run_dir and cfg.run_dir is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        f.counts["run_dir"] = None
    return result


__all__ = ["ChaosConfig", "ChaosResult", "KillRecord", "run_chaos"]
