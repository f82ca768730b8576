"""``--evals``: turns scored by a function, a judge agent and a deferred outcome while
workers of both agents and the evaluators' members are SIGKILLed.

The shop and judge agents run in ``workers`` worker processes (each runs both), their
evaluators in ``evaluators`` processes of ``pyrula-stream evals run`` (stable
``--instance`` names, static members). Turns go in at ``rate``; each names order
``o<n>``. The harness plays the business: order ``n % 4 == 0`` is delivered before its
turn is even submitted, ``1`` right after its result appears (within the window),
``2`` after the window has closed, ``3`` never. Kills alternate between worker processes
and evaluator members over the submission window and the outcomes' windows, each
followed at once by a restart under the same id.

Then, from the topics alone: every sampled turn has exactly one score per evaluator
(``missing_scores``, ``doubled_scores`` for the function and the judge;
``outcomes_missing``, ``outcomes_doubled`` for the outcome), no turn that was not sampled
has one (``unsampled_scores``), each verdict is the right one (``wrong_scores``: the
judge's is known, an outcome is joined exactly when an event of its order has a
timestamp within the window of the turn's finish, before or after it), no judge turn was asked twice
(``judge_turns_doubled``), and the usual ``lost``, ``duplicate_terminal``,
``duplicate_events``. All gated at 0.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.chaos import evals_agents
from pyrula_stream.chaos.broker import run_broker
from pyrula_stream.chaos.effects import AGENT_ENV, PARTITIONS_ENV
from pyrula_stream.chaos.harness import ChaosResult
from pyrula_stream.chaos.monkey import KillRecord
from pyrula_stream.chaos.processes import Managed, Worker, child_env
from pyrula_stream.chaos.verify import Findings
from pyrula_stream.evals import sampled
from pyrula_stream.evals.judges import judge_turn_id
from pyrula_stream.kafka.admin import DEFAULT_PREFIX, TopicSpec, agent_topic_specs, apply_topics
from pyrula_stream.kafka.consumers import read_topic
from pyrula_stream.kafka.io import RecordProducer, TopicFollower
from pyrula_stream.wire.events import decode_event
from pyrula_stream.wire.scores import parse_score
from pyrula_stream.wire.serde import decode_turn_result

SHOP_SPEC = "pyrula_stream.chaos.evals_agents:shop"
JUDGE_SPEC = "pyrula_stream.chaos.evals_agents:grader"
EVALS_KEYS = ("missing_scores", "doubled_scores", "outcomes_missing", "outcomes_doubled")
GATE_KEYS = (
    "lost",
    "duplicate_terminal",
    "duplicate_events",
    *EVALS_KEYS,
    "unsampled_scores",
    "wrong_scores",
    "judge_turns_doubled",
)
RATES = {
    "short": evals_agents.FUNCTION_RATE,
    "quality": evals_agents.JUDGE_RATE,
    "delivered": evals_agents.OUTCOME_RATE,
}


@dataclass
class EvalsConfig:
    turns: int = 80
    workers: int = 2
    evaluators: int = 2
    kills: int = 8
    rate: float = 4.0
    partitions: int = 3
    window_s: float = 4.0
    grace_s: float = 20.0
    """How late an event may be read and still join: outlasts a killed member's session."""
    seed: int | None = None
    bootstrap_servers: str | None = None
    timeout_s: float = 180.0
    run_dir: str | None = None
    keep_run_dir: bool = False
    log: Callable[[str], None] = print


class EvalMember(Managed):
    """``pyrula-stream evals run SHOP --instance evals-<i>``."""

    def __init__(self, index: int, run_dir: Path, bootstrap: str, env: dict[str, str]) -> None:
        self.worker_id = f"evals-{index}"
        argv = [sys.executable, "-m", "pyrula_stream.cli", "-v", "evals", "run", SHOP_SPEC]
        argv += ["--bootstrap-servers", bootstrap, "--instance", self.worker_id]
        argv.append("--static-membership")
        super().__init__(self.worker_id, argv, env, run_dir / f"{self.worker_id}.log")


class _Business(threading.Thread):
    """Follows the shop's results and scores; delivers orders as the plan says."""

    def __init__(self, bootstrap: str, topics: AgentTopics, orders: str, window_s: float):
        super().__init__(name="chaos-business", daemon=True)
        self.topics, self.orders, self.window_s = topics, orders, window_s
        self.producer = RecordProducer(bootstrap)
        self.follower = TopicFollower(bootstrap, client_id="chaos-evals-follower")
        self.finished: dict[str, int] = {}
        self.scored: Counter[tuple[str, str]] = Counter()
        self.late: list[tuple[float, int]] = []
        self.numbers: dict[str, int] = {}
        self.halt = threading.Event()
        self.errors: list[str] = []

    def deliver(self, n: int, when: str) -> None:
        body = json.dumps({"status": "delivered", "when": when}).encode()
        self.producer.send_sync(self.orders, f"o{n}".encode(), body)

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # the run reports it
            self.errors.append(repr(exc))

    def _run(self) -> None:
        wanted = [self.topics.results, self.topics.scores]
        while not self.halt.is_set():
            if set(wanted) - self.follower.followed:
                self.follower.follow(wanted, None)
            for rec in self.follower.poll(0.2):
                if rec.value is None:
                    continue
                if rec.topic == self.topics.scores:
                    s = parse_score(rec.value)
                    self.scored[(s.turn_id, s.evaluator)] += 1
                    continue
                result = decode_turn_result(rec.value, rec.headers)
                if result.turn_id in self.finished:
                    continue
                self.finished[result.turn_id] = result.finished_ms
                n = self.numbers.get(result.turn_id)
                if n is None and isinstance(result.result, dict):
                    n = int(result.result.get("n", -1))
                if n is not None and n % 4 == 1:
                    self.deliver(n, "in window")
                elif n is not None and n % 4 == 2:
                    self.late.append((result.finished_ms / 1000 + self.window_s + 1.5, n))
            now = time.time()
            for due in [d for d in self.late if d[0] <= now]:
                self.late.remove(due)
                self.deliver(due[1], "after the window")

    def close(self) -> None:
        self.halt.set()
        self.join(10)
        self.follower.close()
        self.producer.close()


def _expected(turn: str, evaluator: str) -> bool:
    return sampled(turn, evaluator, RATES[evaluator])


def check(
    numbers: dict[str, int],
    read: Callable[[str], list[Any]],
    topics: AgentTopics,
    judge: AgentTopics,
    orders: str,
    window_s: float,
) -> Findings:
    """Everything the run must show, read from the topics after the processes stopped."""
    f = Findings()
    f.zero(*GATE_KEYS, "error_scores", "outcomes_joined", "outcomes_timed_out")
    results: dict[str, list[Any]] = defaultdict(list)
    for rec in read(topics.results):
        if rec.value is not None:
            r = decode_turn_result(rec.value, rec.headers)
            results[r.turn_id].append(r)
    for turn in numbers:
        if not results.get(turn):
            f.add("lost", example=turn)
        elif len(results[turn]) > 1:
            f.add("duplicate_terminal", example=turn)
    seqs: Counter[tuple[str, int]] = Counter()
    for rec in read(topics.events):
        if rec.value is not None:
            e = decode_event(rec.value, rec.headers)
            seqs[(e.turn_id, e.seq)] += 1
    f.add("duplicate_events", sum(n - 1 for n in seqs.values() if n > 1))
    events: dict[str, list[int]] = defaultdict(list)
    for rec in read(orders):
        events[rec.key].append(rec.ts_ms)
    scores = [parse_score(rec.value) for rec in read(topics.scores) if rec.value is not None]
    counted = Counter((s.turn_id, s.evaluator) for s in scores)
    by = {(s.turn_id, s.evaluator): s for s in scores}
    for turn, n in numbers.items():
        for ev in RATES:
            k, want = counted.get((turn, ev), 0), _expected(turn, ev)
            missing, doubled = (
                ("outcomes_missing", "outcomes_doubled")
                if ev == "delivered"
                else ("missing_scores", "doubled_scores")
            )
            if want and k == 0 and results.get(turn):
                f.add(missing, example=f"{turn} (o{n}) {ev}")
            if k > 1:
                f.add(doubled, k - 1, example=f"{turn} (o{n}) {ev}: {k} scores")
            if not want and k:
                f.add("unsampled_scores", example=f"{turn} {ev}")
            score = by.get((turn, ev))
            if score is None or not results.get(turn):
                continue
            if score.label == "error":
                f.add("error_scores", example=f"{turn} {ev}: {score.reason}")
            if ev == "short":
                right = score.passed is True
            elif ev == "quality":
                right = score.passed is evals_agents.judged_passes(n)
            else:
                finished, window = results[turn][0].finished_ms, int(window_s * 1000)
                joined = any(abs(ts - finished) <= window for ts in events.get(f"o{n}", []))
                f.add("outcomes_joined" if joined else "outcomes_timed_out", 1)
                right = score.timed_out is (not joined) and score.passed is joined
            if not right:
                f.add("wrong_scores", example=f"{turn} (o{n}) {ev}: {score.data()}")
    asked = Counter(rec.key for rec in read(judge.turns))
    f.add("judge_turns_doubled", sum(n - 1 for n in asked.values() if n > 1))
    wanted_judged = {judge_turn_id(t, "quality", "1") for t in numbers if _expected(t, "quality")}
    f.counts["judge_turns"] = len(asked)
    f.counts["judge_turns_unasked"] = len(set(asked) - wanted_judged)
    f.counts["scores"] = len(scores)
    return f


class _Killer(threading.Thread):
    def __init__(
        self,
        procs: list[Managed],
        window_s: float,
        kills: int,
        rng: random.Random,
        say: Callable[[str], None],
    ) -> None:
        super().__init__(name="chaos-evals-killer", daemon=True)
        self.procs, self.rng, self.say = procs, rng, say
        self.plan = sorted(window_s * (i + rng.uniform(0.1, 0.9)) / kills for i in range(kills))
        self.kills: list[KillRecord] = []
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        t0 = time.monotonic()
        for at in self.plan:
            if self.halt.wait(max(0.0, t0 + at - time.monotonic())):
                return
            with self.lock:
                # Alternate: a worker (shop and judge), then an evaluator member, ...
                target = EvalMember if len(self.kills) % 2 else Worker
                proc = self.rng.choice([p for p in self.procs if isinstance(p, target)])
                pid = proc.pid or 0
                proc.kill()
                proc.start()
            kind = "evaluator" if isinstance(proc, EvalMember) else "worker"
            self.kills.append(KillRecord(round(at, 1), proc.name, pid, kind, wall_ts=time.time()))
            self.say(f"  kill t={at:5.1f}s {proc.name} pid {pid} ({kind}); restarted")


def run_evals(cfg: EvalsConfig) -> ChaosResult:
    """The whole ``--evals`` run; never leaves a process behind."""
    started = time.monotonic()
    seed = cfg.seed if cfg.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    run_dir = Path(cfg.run_dir or tempfile.mkdtemp(prefix="pyrula-chaos-evals-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    agent = f"chaosev{uuid.uuid4().hex[:8]}"
    topics = AgentTopics.for_agent(agent, DEFAULT_PREFIX)
    judge = AgentTopics.for_agent(f"{agent}-judge", DEFAULT_PREFIX)
    orders = evals_agents.orders_topic(agent)
    say = cfg.log
    say(
        f"chaos --evals: {cfg.turns} turns, {cfg.workers} workers, {cfg.evaluators} "
        f"evaluator members, {cfg.kills} kills, seed {seed}; agent {agent}; files in {run_dir}"
    )
    with contextlib.ExitStack() as stack:
        bootstrap, _ = stack.enter_context(
            run_broker(cfg.bootstrap_servers, restarts=0, brokers=1, run_dir=run_dir)
        )
        specs = agent_topic_specs(agent, partitions=cfg.partitions, outcomes=True)
        specs += agent_topic_specs(f"{agent}-judge", partitions=cfg.partitions)
        specs.append(TopicSpec(orders, cfg.partitions))
        report = apply_topics(bootstrap, specs)
        if not report.ok:
            raise RuntimeError(report.describe())
        env = child_env(
            {
                AGENT_ENV: agent,
                PARTITIONS_ENV: str(cfg.partitions),
                evals_agents.WINDOW_ENV: str(cfg.window_s),
                evals_agents.GRACE_ENV: str(cfg.grace_s),
            }
        )
        workers = [
            Worker(
                i + 1, run_dir, bootstrap, env, shutdown_grace=5.0, specs=(SHOP_SPEC, JUDGE_SPEC)
            )
            for i in range(cfg.workers)
        ]
        members = [EvalMember(i + 1, run_dir, bootstrap, env) for i in range(cfg.evaluators)]
        procs: list[Managed] = [*workers, *members]
        business = _Business(bootstrap, topics, orders, cfg.window_s)
        numbers: dict[str, int] = {}
        killer: _Killer | None = None
        try:
            for p in procs:
                p.start()
            deadline = time.monotonic() + 90
            while not all(w.ready() for w in workers):
                if time.monotonic() > deadline:
                    raise TimeoutError("workers not ready after 90 s")
                time.sleep(0.2)
            business.start()
            window = cfg.turns / cfg.rate + cfg.window_s + 5
            killer = _Killer(procs, window, cfg.kills, rng, say)
            killer.start()
            numbers = _submit(bootstrap, agent, cfg, business, say)
            _settle(numbers, business, cfg, procs, killer, say)
        finally:
            if killer is not None:
                killer.halt.set()
                killer.join(10)
            business.close()
            for p in procs:
                p.stop(10)
        f = check(
            numbers,
            lambda topic: read_topic(bootstrap, topic),
            topics,
            judge,
            orders,
            cfg.window_s,
        )
    kills = killer.kills if killer else []
    f.counts["business_errors"] = len(business.errors)
    for error in business.errors[:3]:
        f.examples["business_errors"].append(error)
    f.counts.update(
        turns=len(numbers),
        workers=cfg.workers,
        evaluator_members=cfg.evaluators,
        kills=len(kills),
        kills_of_evaluators=len([k for k in kills if k.kind == "evaluator"]),
        seed=seed,
        seconds=round(time.monotonic() - started, 1),
    )
    ok_dir = all(f.counts.get(k, 1) == 0 for k in GATE_KEYS)
    if ok_dir and not cfg.keep_run_dir and cfg.run_dir is None:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        f.counts["run_dir"] = str(run_dir)
    return ChaosResult(f.counts, dict(f.examples), kills)


def _submit(
    bootstrap: str, agent: str, cfg: EvalsConfig, business: _Business, say: Callable[[str], None]
) -> dict[str, int]:
    import asyncio

    from pyrula_stream.client.kafka_client import KafkaAgentClient

    numbers: dict[str, int] = {}

    async def go() -> None:
        async with KafkaAgentClient(bootstrap, timeout=120.0) as client:
            t0 = time.monotonic()
            for n in range(cfg.turns):
                delay = t0 + n / cfg.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if n % 4 == 0:
                    await asyncio.to_thread(business.deliver, n, "before the turn")
                handle = await client.submit(agent, n=n)
                numbers[handle.turn_id] = n
                business.numbers[handle.turn_id] = n

    asyncio.run(go())
    say(f"  submitted {len(numbers)} turns")
    return numbers


def _settle(
    numbers: dict[str, int],
    business: _Business,
    cfg: EvalsConfig,
    procs: list[Managed],
    killer: _Killer,
    say: Callable[[str], None],
) -> None:
    """Wait for every result and every expected score (or the timeout)."""
    expected = {(t, ev) for t in numbers for ev in RATES if _expected(t, ev)}
    deadline = time.monotonic() + cfg.timeout_s + cfg.window_s + cfg.grace_s
    last = 0.0
    while time.monotonic() < deadline:
        done = set(numbers) <= set(business.finished) and expected <= set(business.scored)
        if done and not killer.is_alive():
            time.sleep(2.0)  # a doubled score would be written by now
            return
        with killer.lock:
            for p in procs:
                if not p.alive():
                    say(f"  {p.name} exited on its own; restarting it (log: {p.log_path})")
                    p.kill()
                    p.start()
        if time.monotonic() - last > 5:
            last = time.monotonic()
            say(
                f"  results {len(business.finished)}/{len(numbers)}, scores "
                f"{len(expected & set(business.scored))}/{len(expected)}"
            )
        time.sleep(0.2)
    say("TIMEOUT: not every expected score arrived")


def evals_summary(result: ChaosResult) -> str:
    """The human summary: what ran, each check with examples, PASS or FAIL."""
    c = result.counts
    lines = ["", "== chaos --evals summary =="]
    lines.append(
        f"{c.get('turns')} turns, {c.get('workers')} workers, {c.get('evaluator_members')} "
        f"evaluator members, {c.get('kills')} kills ({c.get('kills_of_evaluators')} of "
        f"evaluators), {c.get('scores')} scores, {c.get('judge_turns')} judge turns, "
        f"outcomes joined {c.get('outcomes_joined')} / timed out {c.get('outcomes_timed_out')}, "
        f"{c.get('seconds')}s"
    )
    for key in (*GATE_KEYS, "error_scores", "business_errors"):
        n = c.get(key, 0)
        mark = "FAIL" if key in GATE_KEYS and n else ("note" if n else " ok ")
        lines.append(f"[{mark}] {key:<22} {n:>5}")
        for example in result.examples.get(key, [])[:3]:
            lines.append(f"         e.g. {example}")
    if c.get("run_dir"):
        lines.append(f"run files kept in {c['run_dir']}")
    failed = [k for k in GATE_KEYS if c.get(k, 1)]
    lines.append("PASS" if not failed else "FAIL: " + ", ".join(failed))
    return "\n".join(lines)


def evals_ok(result: ChaosResult) -> bool:
    return all(result.counts.get(k, 1) == 0 for k in GATE_KEYS)
