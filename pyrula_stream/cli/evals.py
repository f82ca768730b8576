"""``pyrula-stream evals``: how an agent's versions score.

``evals report AGENT [--evaluator E] [--since WHEN] [--baseline V] [--json]`` reads
``<agent>.scores`` (committed records, each score once) and compares the agent versions'
pass rates and means with 95% intervals (``comparison/report.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import time

from pyrula_stream.cli.common import (
    KAFKA_TIMEOUT_S,
    Commands,
    bootstrap_from,
    kafka_config_from,
    positive_seconds,
    with_bootstrap,
)

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


def _report_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--evaluator", help="only this evaluator's scores")
    p.add_argument(
        "--baseline", help="the version the others are compared with (default: most scores)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")


def register(sub: Commands[argparse.ArgumentParser]) -> None:
    """``evals report``."""
    e = sub.add_parser("evals", help="compare an agent's versions by their scores")
    e_sub = e.add_subparsers(dest="evals_command", required=True)
    r = with_bootstrap(
        e_sub.add_parser("report", help="AGENT: each evaluator's scores by agent version")
    )
    r.add_argument("agent")
    r.add_argument("--since", type=since_ms, help="only scores written since: 24h, 7d, a date")
    r.add_argument("--timeout", type=positive_seconds, default=KAFKA_TIMEOUT_S)
    _report_options(r)
    r.set_defaults(func=cmd_report)
