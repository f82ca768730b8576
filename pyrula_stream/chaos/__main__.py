"""``python -m pyrula_stream.chaos --turns N --workers W --kills K [--seed S] [--hostile]``.

Starts a local Kafka broker unless ``--bootstrap-servers`` or ``KAFKA_BOOTSTRAP_SERVERS``
names one, runs the experiment, prints a summary and, as the last line, one JSON object.
Exit code 0 when ``lost``, ``duplicate_terminal``, ``duplicate_events``,
``repeated_llm_after_journal`` and ``duplicate_effects`` are all 0 (with ``--hostile``
also ``worker_crashes``, ``hostile_not_in_dlq``, ``forged_replies_taken``,
``hostile_dlq_doubled``, ``forged_answers_taken``, ``invented_tenant_overshoot`` and
``valid_turns_stuck``; with ``--approvals`` also ``approved_not_run``, ``rejected_ran``,
``answers_lost`` and ``answers_doubled``; with ``--tenants`` also ``quota_overshoot``, and
at least one deferral; with ``--large`` also ``dangling_refs`` and ``orphans_left``, with
``large_turns`` at least 50 and at least one kill between object write and commit; with
``--batch`` also ``batch_calls_submitted_twice``,
``batch_responses_applied_twice`` and ``cost_counted_twice``, and at least 4
``kills_during_batches``), else 1. ``--autoscale`` is a run of its own (``autoscale.py``):
workers scaled on lag as KEDA would, gating also ``parked_not_resumed``. ``--evals`` is
a run of its own too (``evals.py``): turns scored by a function, a judge agent and a
deferred outcome while workers and evaluator members are SIGKILLed, gating
``missing_scores``, ``doubled_scores``, ``outcomes_missing`` and ``outcomes_doubled``
beside ``lost``, ``duplicate_terminal`` and ``duplicate_events``.

With ``--hostile`` the run is ``--secured`` by default (its own SASL broker with the
chaos agent's generated ACLs, see ``secured.py``) unless another broker setup is asked for.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import Any

from pyrula_stream.chaos.approvals import APPROVAL_KEYS
from pyrula_stream.chaos.autoscale import AutoscaleConfig, autoscale_summary, run_autoscale
from pyrula_stream.chaos.batch_lane import BATCH_KEYS, MIN_KILLS_DURING_BATCHES
from pyrula_stream.chaos.evals import EvalsConfig, evals_ok, evals_summary, run_evals
from pyrula_stream.chaos.harness import (
    GATE_KEYS,
    THREAD_GATE_KEYS,
    ChaosConfig,
    ChaosResult,
    run_chaos,
)
from pyrula_stream.chaos.hostile import KINDS
from pyrula_stream.chaos.hostile_check import HOSTILE_KEYS
from pyrula_stream.chaos.large import LARGE_KEYS, MIN_LARGE_TURNS
from pyrula_stream.chaos.tenants import DEFAULT_TIMEOUT_S, DEFAULT_TURNS, TENANT_KEYS
from pyrula_stream.chaos.verify import SUBAGENT_KEYS
from pyrula_stream.errors import PyrulaError
from pyrula_stream.testing import BOOTSTRAP_ENV

HEADLINE = (
    "turns",
    "workers",
    "kills",
    "kills_after_answer",
    "broker_restarts",
    "broker_kills",
    "leader_changes_seen",
    "coordinator_moves_seen",
    "lost",
    "duplicate_terminal",
    "duplicate_events",
    "repeated_llm_after_journal",
    "repeated_llm_before_commit",
    "duplicate_effects",
    "thread_turns_missing",
    "thread_turns_doubled",
    "seconds",
)
EXPLAIN = {
    "lost": "turns without a terminal event",
    "duplicate_terminal": "turns with more than one terminal event",
    "duplicate_events": "events whose (turn, seq) was already published",
    "seq_gaps": "turns whose seqs are not contiguous from 0",
    "events_after_terminal": "events after a turn's terminal event",
    "out_of_order_events": "turns whose events are not in seq order",
    "repeated_llm_after_journal": "model calls made again after their response was journaled",
    "repeated_llm_before_commit": "model calls made again because a crash came before the commit",
    "unjournaled_llm_calls": "model calls whose response never reached the journal (the "
    "turn ended in the commit that would have carried it)",
    "duplicate_effects": "idempotency keys whose side effect happened more than once",
    "repeated_tool_after_journal": "tool runs after the tool's result was journaled",
    "repeated_tool_before_commit": "tool runs again because a crash came before the commit",
    "unstable_idempotency_keys": "turns whose one tool call had effects under several keys",
    "missing_effects": "turns with no applied effect",
    "journal_gaps": "turns whose journaled step indices are not contiguous from 0",
    "duplicate_journal_steps": "step entries journaled more than once",
    "steps_left_after_finish": "finished turns whose step keys were not tombstoned",
    "missing_terminal_record": "turns without a terminal journal record",
    "failed_turns": "turns that ended with run:error",
    "wrong_results": "completed turns whose answer is not the model's",
    "dead_letters": "records in the agent's DLQ",
    "worker_crashes": "workers that exited without being killed by the harness",
    "child_turns_doubled": "sub-agent calls that ran more than one child turn (--subagents)",
    "replies_lost": "child outcomes that never reached their parent (--subagents)",
    "replies_doubled": "child outcomes taken or written more than once (--subagents)",
    "thread_turns_missing": "completed turns missing from their thread (--threads)",
    "thread_turns_doubled": "turns recorded more than once in their thread (--threads)",
    "thread_turns_out_of_order": "threads whose turns are not in submission order",
    "hostile_not_in_dlq": "hostile records without their documented outcome (--hostile)",
    "forged_replies_taken": "forged replies a parent took (--hostile)",
    "hostile_headers_lost": "dead letters of hostile records without their chaos-hostile tag",
    "hostile_dlq_doubled": "hostile records dead-lettered more than once",
    "forged_answers_taken": "answers a client forged (on signals; with --secured also on "
    "answers) that a turn took (--hostile)",
    "invented_tenant_overshoot": "minutes whose turns of unknown tenants passed one bucket's "
    "turns_per_minute plus its bound (--hostile)",
    "valid_turns_stuck": "valid turns without a terminal event when the run ended (--hostile)",
    "control_skips_uncounted": "workers whose skipped-control count is below the unreadable sent",
    "control_skips_unread": "workers whose /metrics did not answer (a mesh serves none)",
    "approved_not_run": "approved gated calls whose tool never took effect (--approvals)",
    "rejected_ran": "rejected or expired gated calls whose tool took effect (--approvals)",
    "answers_lost": "answers sent that no gated tool:result reflects (--approvals)",
    "answers_doubled": "questions answered (or their result published) twice (--approvals)",
    "questions_unanswered": "turns whose question the reviewer never answered (--approvals)",
    "quota_overshoot": "tenant windows whose usage passed the quota plus its documented "
    "bound (--tenants)",
    "tenant_quota_stops": "running turns stopped at their tenant's quota (--tenants)",
    "dangling_refs": "references whose object is missing or altered, after one sweep (--large)",
    "orphans_left": "stored objects no live record references, after one sweep (--large)",
    "batch_calls_submitted_twice": "calls the batch provider was given more than once (--batch)",
    "batch_responses_applied_twice": "batch outcomes journaled (or applied as model steps) "
    "more than once (--batch)",
    "cost_counted_twice": "model calls billed more than once (--batch)",
    "batch_failures": "batch calls journaled without a response (sent live instead)",
}


def answer_kills(c: dict[str, object]) -> str:
    """The ``--approvals`` part of the kills line: targeted kills and where they landed."""
    if "answer_kills" not in c:
        return ""
    return (
        f", {c['answer_kills']} right after an answer's commit ({c['answer_kills_owner']} "
        f"on the turn's owner, {c['kills_after_answer']} before the gated call went on)"
    )


def summary(result: ChaosResult) -> str:
    c = result.counts
    lines = ["", "== chaos summary =="]
    after_reply = c.get("kills_after_reply", 0)
    lines.append(
        f"{c['turns']} turns, {c['workers']} workers, {c['kills']} kills "
        f"({c['kills_after_effect']} right after a side effect"
        f"{f', {after_reply} right after a sub-agent reply' if after_reply else ''}"
        f"{answer_kills(c)}), "
        f"{c.get('broker_restarts', 0)} broker restarts, {c['seconds']}s"
    )
    lines.append(
        f"{c.get('events', 0)} events, {c.get('model_calls', 0)} model calls, "
        f"{c.get('effects', 0)} effects, {c.get('journal_records', 0)} journal records; "
        f"terminal attempts {c.get('terminal_attempts')}"
    )
    for restart in result.broker_restarts:
        lines.append(f"  broker restart t={restart.at_s}s {restart.signal}, down {restart.down_s}s")
    for kill in result.kills:
        lines.append(
            f"  kill t={kill.at_s}s {kill.worker} pid {kill.pid} {kill.kind} {kill.detail}".rstrip()
        )
    for key, text in EXPLAIN.items():
        n = c.get(key, 0)
        gated = key in GATE_KEYS or key in SUBAGENT_KEYS or key in THREAD_GATE_KEYS
        gated = gated or (key in HOSTILE_KEYS and "hostile_not_in_dlq" in c)
        gated = gated or (key in APPROVAL_KEYS and "approved_not_run" in c)
        gated = gated or (key in TENANT_KEYS and "quota_overshoot" in c)
        gated = gated or (key in LARGE_KEYS and "dangling_refs" in c)
        gated = gated or (key in BATCH_KEYS and "batch_calls_submitted_twice" in c)
        mark = "FAIL" if gated and n else ("note" if n else " ok ")
        lines.append(f"[{mark}] {key:<28} {n:>5}  {text}")
        for example in result.examples.get(key, [])[:3]:
            lines.append(f"         e.g. {example}")
    if c.get("failed_by_code"):
        lines.append(f"failed turns by code: {c['failed_by_code']}")
    lines.append(
        f"longest time with open turns and none ending: {c.get('longest_stall_s')}s "
        f"(from t={c.get('longest_stall_at_s')}s)"
    )
    lines.append(f"worker exit codes after SIGTERM: {c.get('worker_exit_codes')} (None: SIGKILLed)")
    if result.worker_log:
        lines.append("worker log warnings/errors (count, line with numbers masked):")
        lines += [f"  {n:>4} {text}" for n, text in result.worker_log[:12]]
    if c.get("run_dir"):
        lines.append(f"run files kept in {c['run_dir']}")
    if "quota_overshoot" in c:
        lines.append(
            f"tenants: {c.get('deferrals')} deferrals {c.get('deferrals_by_reason')} of "
            f"{c.get('deferred_turns')} turns, {c.get('tenant_quota_stops')} quota stops, "
            f"{c.get('quota_windows')} windows, most past a cap {c.get('quota_most_past_cap')}, "
            f"bounds {c.get('quota_bounds')}"
        )
    if "dangling_refs" in c:
        lines.append(
            f"large: {c.get('large_turns')} turns carried references (at least "
            f"{MIN_LARGE_TURNS}), {c.get('kills_after_objects')} workers killed between "
            f"object write and commit, {c.get('stored_objects')} objects kept, "
            f"{c.get('orphans_swept')} orphans swept"
        )
    if c.get("hostile_kinds"):
        lines.append(f"hostile records by kind: {c['hostile_kinds']}")
    if "forged_answers_sent" in c:
        lines.append(
            f"forged answers sent {c['forged_answers_sent']}, refused by the broker "
            f"{c.get('forged_answers_refused', 0)}; forged replies sent "
            f"{c.get('forged_replies_sent', 0)}, refused {c.get('forged_replies_refused', 0)}"
            f"{' (SASL, generated ACLs)' if c.get('secured') else ''}; "
            "most flood signals one turn held "
            f"{c.get('flood_signals_held_most', 0)}, unknown tenants' turns per minute "
            f"{c.get('unknown_tenant_turns_per_minute')} (bucket {c.get('unknown_tenant_bound')})"
        )
    failed = [k for k in GATE_KEYS if c.get(k, 1)] + [k for k in SUBAGENT_KEYS if c.get(k, 0)]
    if "hostile_not_in_dlq" in c:
        failed += [k for k in HOSTILE_KEYS if c.get(k, 1)]
    if "approved_not_run" in c:
        failed += [k for k in APPROVAL_KEYS if c.get(k, 1)]
    if "quota_overshoot" in c:
        failed += [k for k in TENANT_KEYS if c.get(k, 1)]
        failed += [] if c.get("deferrals") else ["deferrals (none: the quotas never bit)"]
    if "dangling_refs" in c:
        failed += [k for k in LARGE_KEYS if c.get(k, 1)]
        if c.get("large_turns", 0) < MIN_LARGE_TURNS:
            failed.append(f"large_turns (under {MIN_LARGE_TURNS})")
        if not c.get("kills_after_objects"):
            failed.append("kills_after_objects (none: no kill hit the window)")
    if "batch_calls_submitted_twice" in c:
        failed += [k for k in BATCH_KEYS if c.get(k, 1)]
        if c.get("kills_during_batches", 0) < MIN_KILLS_DURING_BATCHES:
            failed.append(f"kills_during_batches < {MIN_KILLS_DURING_BATCHES}")
        lines.append(
            f"batch lane: {c.get('batches')} batches, {c.get('batch_calls_submitted')} calls "
            f"submitted, {c.get('batch_steps_journaled')} model steps journaled, "
            f"{c.get('model_calls_by_batch')} llm:complete by batch, "
            f"{c.get('kills_during_batches')} kills while a batch was open "
            f"{c.get('kills_by_batch_phase')}, {c.get('kills_after_batch_tag')} of them right "
            "after a batch was journaled"
        )
    lines.append("PASS" if result.ok else "FAIL: " + ", ".join(failed))
    return "\n".join(lines)


def run_autoscale_mode(args: argparse.Namespace) -> int:
    """``--autoscale``: its own run (``autoscale.py``), its summary, the JSON line."""
    cfg = (AutoscaleConfig.quick if args.quick else AutoscaleConfig)(
        **({"waves": args.waves} if args.waves else {}),
        **({"wave_turns": args.wave_turns} if args.wave_turns else {}),
        max_workers=args.max_workers,
        lag_threshold=args.lag_threshold,
        partitions=args.partitions,
        seed=args.seed,
        bootstrap_servers=args.bootstrap_servers,
        timeout_s=args.timeout,
        run_dir=args.run_dir,
        keep_run_dir=args.keep,
        log=lambda text: print(text, flush=True),
    )
    try:
        result = run_autoscale(cfg)
    except KeyboardInterrupt as exc:
        print(f"interrupted ({exc or 'SIGINT'}); every process was stopped", flush=True)
        return 130
    except PyrulaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(autoscale_summary(result), flush=True)
    print(json.dumps(result.counts, default=str), flush=True)
    return 0 if result.ok else 1


def run_evals_mode(args: argparse.Namespace) -> int:
    """``--evals``: its own run (``evals.py``), its summary, the JSON line."""
    cfg = EvalsConfig(
        turns=args.turns,
        workers=args.workers,
        evaluators=args.evaluators,
        kills=args.kills,
        rate=args.rate,
        partitions=args.partitions,
        seed=args.seed,
        bootstrap_servers=args.bootstrap_servers,
        timeout_s=args.timeout,
        run_dir=args.run_dir,
        keep_run_dir=args.keep,
        log=lambda text: print(text, flush=True),
    )
    try:
        result = run_evals(cfg)
    except KeyboardInterrupt as exc:
        print(f"interrupted ({exc or 'SIGINT'}); every process was stopped", flush=True)
        return 130
    except PyrulaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(evals_summary(result), flush=True)
    print(json.dumps(result.counts, default=str), flush=True)
    return 0 if evals_ok(result) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pyrula_stream.chaos", description=__doc__)
    p.add_argument(
        "--turns", type=int, default=None, help=f"default 300 ({DEFAULT_TURNS} with --tenants)"
    )
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--kills", type=int, default=8)
    p.add_argument(
        "--broker-restarts",
        type=int,
        default=0,
        help="stop the broker this many times mid-run (the first with SIGKILL) and restart "
        "it on the same port and data directory; the harness then runs its own broker",
    )
    p.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="run on the harness's own local cluster of this many brokers (and a controller)",
    )
    p.add_argument(
        "--broker-kills",
        type=int,
        default=0,
        help="with --brokers: SIGKILL this many brokers, one at a time (the workers' "
        "transaction coordinator, a turns leader, the group coordinator, ...), then one "
        "rolling restart",
    )
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--bootstrap-servers",
        default=None,
        help="default: $KAFKA_BOOTSTRAP_SERVERS, else a local broker is started",
    )
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument(
        "--subagents",
        action="store_true",
        help="each turn calls two children (one via gather) on a second agent",
    )
    p.add_argument("--rate", type=float, default=5.0, help="turns submitted per second")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for the last turns after the last submission (default 180, "
        f"{DEFAULT_TIMEOUT_S:.0f} with --tenants: deferred turns wait for later minutes)",
    )
    p.add_argument(
        "--fast-takeover",
        action="store_true",
        help="workers use static membership (group.instance.id = worker id)",
    )
    p.add_argument("--group-protocol", default="classic", choices=["classic", "consumer"])
    p.add_argument(
        "--threads",
        action="store_true",
        help="spread the turns over threads of --turns-per-thread turns and check each thread",
    )
    p.add_argument("--turns-per-thread", type=int, default=5)
    p.add_argument(
        "--hostile",
        action="store_true",
        help="also send generated hostile records (turns, replies, control) among the turns "
        "and gate worker_crashes, hostile_not_in_dlq, forged_replies_taken, hostile_dlq_doubled, "
        "forged_answers_taken, invented_tenant_overshoot and valid_turns_stuck",
    )
    p.add_argument(
        "--hostile-kinds",
        default=",".join(KINDS),
        help="comma-separated kinds of hostile records to send (default: all)",
    )
    p.add_argument(
        "--hostile-records",
        type=int,
        default=None,
        help="how many hostile records (default: half of --turns, at least 20)",
    )
    p.add_argument(
        "--approvals",
        action="store_true",
        help="each turn makes one approval-gated call that a reviewer answers (approve or "
        "reject at random delays); gate approved_not_run, rejected_ran, answers_lost and "
        "answers_doubled",
    )
    p.add_argument(
        "--tenants",
        action="store_true",
        help="spread the turns over three tenants with small turns_per_minute and "
        "tokens_per_minute quotas (turns get deferred); gate quota_overshoot",
    )
    p.add_argument(
        "--secured",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run on the harness's own SASL_SSL broker with the agent's generated ACLs: "
        "workers, submitter and forged answers each connect as their principal (worker, "
        "client), so a client's forged answer meets the broker's ACLs (default: on with "
        "--hostile, unless --bootstrap-servers, --broker-restarts, --brokers, --subagents "
        "or --approvals asks for another setup)",
    )
    p.add_argument(
        "--batch",
        action="store_true",
        help="the model calls go by the batch lane to an OpenAI batch server of its own "
        "process; gate batch_calls_submitted_twice, batch_responses_applied_twice and "
        f"cost_counted_twice, and kills_during_batches >= {MIN_KILLS_DURING_BATCHES}",
    )
    p.add_argument(
        "--autoscale",
        action="store_true",
        help="scale worker processes between 1 and --max-workers on the turns topic's lag as "
        "KEDA would, under --waves waves of --wave-turns turns, some parked on timers and "
        "signals; gate parked_not_resumed, and scale_ups and scale_downs >= 3 and "
        "parked_handed_over >= 1 (see chaos/autoscale.py)",
    )
    p.add_argument(
        "--evals",
        action="store_true",
        help="turns scored by a function, a judge agent and a deferred outcome while "
        "workers and evaluator members are SIGKILLed; gate missing_scores, doubled_scores, "
        "outcomes_missing and outcomes_doubled (see chaos/evals.py; default 80 turns)",
    )
    p.add_argument("--evaluators", type=int, default=2, help="--evals: evaluator members")
    p.add_argument("--quick", action="store_true", help="--autoscale: the test suite's size")
    p.add_argument(
        "--waves", type=int, default=None, help="--autoscale: bursts (default 4, 3 --quick)"
    )
    p.add_argument(
        "--wave-turns", type=int, default=None, help="--autoscale: turns per wave (default 80)"
    )
    p.add_argument("--max-workers", type=int, default=4, help="--autoscale: most workers")
    p.add_argument("--lag-threshold", type=int, default=5, help="--autoscale: lag per worker")
    p.add_argument(
        "--large",
        action="store_true",
        help="a share of the turns carry values past a record, stored by reference in a local "
        "object store; workers are also killed between the object write and the commit; gate "
        "dangling_refs and orphans_left (after one sweep), large_turns >= 50 (chaos/large.py)",
    )
    p.add_argument(
        "--large-store",
        choices=("local", "s3"),
        default="local",
        help="--large: the object store, a local directory or a real S3 server on loopback "
        "(versitygw, built by make setup)",
    )
    p.add_argument("--run-dir", default=None, help="keep the logs and files here")
    p.add_argument("--keep", action="store_true", help="keep the run files even on success")
    args = p.parse_args(argv)
    if args.turns is None:
        args.turns = DEFAULT_TURNS if args.tenants else (80 if args.evals else 300)
    if args.timeout is None:
        args.timeout = DEFAULT_TIMEOUT_S if args.tenants else 180.0
    if args.turns < 1 or args.workers < 1 or min(args.kills, args.broker_restarts) < 0:
        p.error("--turns and --workers must be >= 1, --kills and --broker-restarts >= 0")
    if args.broker_kills and args.brokers < 3:
        p.error("--broker-kills needs --brokers 3 or more (one broker down at a time)")
    if args.brokers > 1 and args.broker_restarts:
        p.error("--broker-restarts is for the single broker; use --broker-kills with --brokers")
    if args.rate <= 0:
        p.error("--rate must be > 0")
    if args.hostile_records is not None and (args.hostile_records < 1 or not args.hostile):
        p.error("--hostile-records needs --hostile and must be >= 1")
    kinds = tuple(k.strip() for k in args.hostile_kinds.split(",") if k.strip())
    if not kinds or set(kinds) - set(KINDS):
        p.error(f"--hostile-kinds takes some of {', '.join(KINDS)}")
    if args.secured is None:
        elsewhere = args.bootstrap_servers or os.environ.get(BOOTSTRAP_ENV)
        others = elsewhere or args.broker_restarts or args.brokers > 1
        args.secured = args.hostile and not (others or args.subagents or args.approvals)
    logging.basicConfig(level=logging.WARNING)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    if args.autoscale:
        return run_autoscale_mode(args)
    if args.evals:
        return run_evals_mode(args)
    cfg = ChaosConfig(
        turns=args.turns,
        workers=args.workers,
        kills=args.kills,
        broker_restarts=args.broker_restarts,
        brokers=args.brokers,
        broker_kills=args.broker_kills,
        seed=args.seed,
        bootstrap_servers=args.bootstrap_servers,
        partitions=args.partitions,
        rate=args.rate,
        timeout_s=args.timeout,
        fast_takeover=args.fast_takeover,
        group_protocol=args.group_protocol,
        turns_per_thread=args.turns_per_thread if args.threads else 0,
        run_dir=args.run_dir,
        keep_run_dir=args.keep,
        subagents=args.subagents,
        approvals=args.approvals,
        tenants=args.tenants,
        batch=args.batch,
        secured=args.secured,
        hostile=(
            (args.hostile_records if args.hostile_records is not None else max(20, args.turns // 2))
            if args.hostile
            else 0
        ),
        hostile_kinds=kinds,
        large=args.large,
        large_store=args.large_store,
        log=lambda text: print(text, flush=True),
    )
    try:
        result = run_chaos(cfg)
    except KeyboardInterrupt as exc:
        print(f"interrupted ({exc or 'SIGINT'}); every process was stopped", flush=True)
        return 130
    except PyrulaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary(result), flush=True)
    first = {k: result.counts[k] for k in HEADLINE if k in result.counts}
    print(json.dumps({**first, **result.counts}, default=str), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
