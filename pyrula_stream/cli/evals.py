"""``pyrula-stream evals``: score an agent's turns, and compare its versions by the scores.

``evals run MODULE:AGENT`` runs the agent's evaluators as a consumer group of their own
(``evals.stream``), until SIGTERM or Ctrl-C.

``evals report AGENT [--evaluator E] [--since WHEN] [--baseline V] [--json]`` reads
``<agent>.scores`` (committed records, each score once) and compares the agent versions'
pass rates and means with 95% intervals (``comparison/report.py``).

``evals offline MODULE:AGENT (--turns FILE... | --golden CASES.jsonl [--version V ...])
[--evaluator MODULE:FN ...]`` runs function evaluators over recorded turns, or over a
golden set run offline on each version, and prints the same report
(``comparison/offline.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib
import json
import os
import re
import signal
import sys
import threading
import time
from typing import Any

from pyrula_stream.cli.common import (
    KAFKA_TIMEOUT_S,
    Commands,
    bootstrap_from,
    kafka_config_from,
    load_agent,
    positive_seconds,
    with_bootstrap,
)


def cmd_run(args: argparse.Namespace) -> int:
    from pyrula_stream.errors import ConfigurationError
    from pyrula_stream.evals.stream.runner import EvalStream

    agent = load_agent(args.agent)
    if not agent.evaluators:
        raise ConfigurationError(
            f"agent '{agent.name}' declares no evaluators: @kafka_agent(evaluators=[...])"
        )
    metrics = None
    if args.metrics_port is not None:
        metrics, url = serve_score_metrics(args.metrics_host, args.metrics_port)
        print(f"metrics on {url}", flush=True)
    stream = EvalStream(
        agent,
        bootstrap_from(args),
        instance=args.instance,
        kafka_config=kafka_config_from(args),
        on_batch=metrics.observe if metrics is not None else None,
        static=args.static_membership,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    names = ", ".join(f"{e.name} ({e.kind}, {e.sample_rate:g})" for e in stream.evaluators)
    print(f"evaluating {agent.name}: {names}; instance {stream.instance}", flush=True)
    stream.run(stop)
    print(f"stopped: {dict(stream.stats)}", flush=True)
    return 0


def serve_score_metrics(host: str, port: int) -> tuple[Any, str]:
    """The evaluators' Prometheus series (``ScoreMetrics``) served on ``host:port``
    (``/metrics``; port 0 picks a free one), from a thread of their own; and the URL."""
    from prometheus_client import CollectorRegistry, start_http_server

    from pyrula_stream.observability.score_metrics import ScoreMetrics

    registry = CollectorRegistry()
    metrics = ScoreMetrics(registry)
    server, _ = start_http_server(port, addr=host, registry=registry)
    return metrics, f"http://{host}:{server.server_port}/metrics"


_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_ms(text: str) -> int:
    """``--since``: an age (``30m``, ``24h``, ``7d``) or an ISO date or time (UTC unless
    it names a zone), as epoch milliseconds."""
    ago = _AGO.match(text.strip())
    if ago:
        return int((time.time() - float(ago[1]) * _UNIT_S[ago[2]]) * 1000)
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since takes an age (30m, 24h, 7d) or an ISO date/time, got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def cmd_report(args: argparse.Namespace) -> int:
    from pyrula_stream.comparison.report import build_report
    from pyrula_stream.comparison.scores import read_scores

    read = read_scores(
        bootstrap_from(args),
        args.agent,
        prefix=args.prefix,
        since_ms=args.since,
        timeout_s=args.timeout,
        kafka_config=kafka_config_from(args),
    )
    report = build_report(
        args.agent,
        read.scores,
        evaluator=args.evaluator,
        baseline=args.baseline,
        duplicates=read.duplicates,
        malformed=read.malformed,
    )
    print(json.dumps(report.as_json()) if args.json else report.text())
    return 0


def load_evaluator(spec: str) -> Any:
    """``MODULE:NAME`` -> the evaluator (a function of the turn, or a declared one)."""
    from pyrula_stream.errors import ConfigurationError

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"--evaluator takes MODULE:NAME, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"--evaluator {spec}: importing {module_name!r} failed: {exc}"
        ) from None
    found = getattr(module, attr, None)
    if found is None:
        raise ConfigurationError(f"--evaluator {spec}: module {module_name!r} has no {attr!r}")
    return found


def cmd_offline(args: argparse.Namespace) -> int:
    from pyrula_stream.comparison.offline import (
        OfflineEvaluator,
        evaluate,
        golden_turns,
        load_golden,
        recorded_turn,
    )
    from pyrula_stream.comparison.report import build_report
    from pyrula_stream.errors import ConfigurationError
    from pyrula_stream.state.history import TurnRecording

    agent = load_agent(args.agent)
    declared = [load_evaluator(e) for e in args.evaluator] or list(getattr(agent, "evaluators", ()))
    functions = [e for e in declared if getattr(e, "kind", "function") == "function"]
    if not functions:
        raise ConfigurationError(
            f"no function evaluators for {agent.name!r}: name them with --evaluator "
            "MODULE:FN, or declare them on the agent (evaluators=[...])"
        )
    evaluators = [OfflineEvaluator.of(e) for e in functions]
    if args.golden:
        versions = args.version or _experiment_versions(agent)
        turns = asyncio.run(golden_turns(agent, load_golden(args.golden), versions))
    else:
        import glob

        paths = sorted({p for pattern in args.turns for p in glob.glob(pattern)})
        if not paths:
            raise ConfigurationError(f"no recorded turns match {args.turns}")
        turns = [recorded_turn(TurnRecording.load(p)) for p in paths]
    report = build_report(
        agent.name,
        evaluate(turns, evaluators),
        evaluator=args.evaluator_name,
        baseline=args.baseline,
    )
    print(json.dumps(report.as_json()) if args.json else report.text())
    return 0


def _experiment_versions(agent: Any) -> list[str | None]:
    """The versions a golden set runs on by default: the experiment's variants, else the
    agent's current version alone."""
    if agent.experiment is not None:
        return sorted(agent.experiment.variants)
    return [agent.version]


def _report_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--baseline", help="the version the others are compared with (default: most scores)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")


def register(sub: Commands[argparse.ArgumentParser]) -> None:
    """``evals run``, ``evals report`` and ``evals offline``."""
    e = sub.add_parser("evals", help="score an agent's turns; compare its versions by them")
    e_sub = e.add_subparsers(dest="evals_command", required=True)
    run = with_bootstrap(
        e_sub.add_parser("run", help="MODULE:AGENT: run its evaluators (their own group)")
    )
    run.add_argument("agent", help="MODULE:AGENT, an agent with evaluators=[...]")
    run.add_argument(
        "--instance",
        default=None,
        help="this member's stable name (its transactional id): a restarted member with "
        "the same name fences its dead self at once (default: host, pid, random)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve the scores' Prometheus series (pyrula_eval_*) on this port",
    )
    run.add_argument("--metrics-host", default="127.0.0.1", help="default 127.0.0.1")
    run.add_argument(
        "--static-membership",
        action="store_true",
        help="join as a static member (group.instance.id = --instance): a restarted member "
        "gets its partitions back at once (a pod restarted in place)",
    )
    run.set_defaults(func=cmd_run)
    r = with_bootstrap(
        e_sub.add_parser("report", help="AGENT: each evaluator's scores by agent version")
    )
    r.add_argument("agent")
    r.add_argument("--since", type=since_ms, help="only scores written since: 24h, 7d, a date")
    r.add_argument("--timeout", type=positive_seconds, default=KAFKA_TIMEOUT_S)
    r.add_argument("--evaluator", dest="evaluator", help="only this evaluator's scores")
    _report_options(r)
    r.set_defaults(func=cmd_report)

    o = e_sub.add_parser(
        "offline", help="MODULE:AGENT: evaluators over recorded turns or a golden set"
    )
    o.add_argument("agent", help="MODULE:AGENT")
    source = o.add_mutually_exclusive_group(required=True)
    source.add_argument("--turns", nargs="+", help="turn files from `turn export` (globs)")
    source.add_argument("--golden", help='JSON lines: {"id", "params": {...}, "expected"}')
    o.add_argument(
        "--version",
        action="append",
        default=[],
        help="with --golden: a version to run (repeatable; default: the experiment's variants)",
    )
    o.add_argument(
        "--evaluator",
        action="append",
        default=[],
        help="MODULE:FN, a function of the turn (repeatable; default: the agent's evaluators)",
    )
    o.add_argument("--only", dest="evaluator_name", help="report only this evaluator")
    _report_options(o)
    o.set_defaults(func=cmd_offline)
