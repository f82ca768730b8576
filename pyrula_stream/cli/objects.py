"""``pyrula-stream objects sweep AGENT``: delete the agent's stored payloads that no live
record references any more (``objects/sweep.py``), older than ``--grace-seconds``.

Prints one JSON line: what was listed, referenced, left for being young, deleted. Safe to
run twice, and while workers run: an object younger than the grace is never deleted.
"""

from __future__ import annotations

import argparse
import json

from pyrula_stream.cli.common import (
    Commands,
    add_object_store_argument,
    bootstrap_from,
    kafka_config_from,
    with_bootstrap,
)
from pyrula_stream.errors import ConfigurationError


def cmd_sweep(args: argparse.Namespace) -> int:
    from pyrula_stream.objects.sweep import live_digests, object_prefix, sweep
    from pyrula_stream.objects.urls import store_from_environment

    store = store_from_environment(args.object_store)
    if store is None:
        raise ConfigurationError(
            "objects sweep needs the store: --object-store URL or PYRULA_OBJECT_STORE"
        )
    if args.grace_seconds < 0:
        raise ConfigurationError(f"--grace-seconds must be >= 0, got {args.grace_seconds}")
    counts: list[int] = []

    def live() -> set[str]:
        digests, topics, records = live_digests(
            bootstrap_from(args), args.prefix, kafka_config=kafka_config_from(args)
        )
        counts.extend((topics, records))
        return digests

    report = sweep(
        store,
        object_prefix(args.prefix, args.agent),
        live,
        grace_s=args.grace_seconds,
        dry_run=args.dry_run,
    )
    report.topics, report.records = counts
    print(json.dumps({"agent": args.agent, "dry_run": args.dry_run, **report.summary()}))
    return 0


def register(sub: Commands[argparse.ArgumentParser]) -> None:
    """``objects sweep``."""
    from pyrula_stream.objects.sweep import DEFAULT_GRACE_S

    o = sub.add_parser("objects", help="stored payloads (values too big for a record)")
    o_sub = o.add_subparsers(dest="objects_command", required=True)
    s = with_bootstrap(
        o_sub.add_parser("sweep", help="AGENT: delete objects no live record references")
    )
    s.add_argument("agent")
    add_object_store_argument(s)
    s.add_argument(
        "--grace-seconds",
        type=float,
        default=DEFAULT_GRACE_S,
        help=f"never delete an object younger than this (default {DEFAULT_GRACE_S:g}): its "
        "commit may be in flight; keep it past the producers' transaction.timeout.ms",
    )
    s.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")
    s.set_defaults(func=cmd_sweep)
