"""``pyrula-stream dlq``: list an agent's dead letters and redrive chosen ones.

``dlq list AGENT [--reason TEXT] [--code CODE]`` prints one JSON line per dead letter
(offset, source, code, reason, time, and its redrive if it had one). ``dlq redrive AGENT
--offset N [--offset M ...] [--reason TEXT] [--code CODE]`` sends the chosen ones back to
their source topic, once each, however often it runs (``client/redrive.py``), and prints
one JSON line per chosen dead letter saying what it did.
"""

from __future__ import annotations

import argparse
import getpass
import json
from typing import TYPE_CHECKING

from pyrula_stream.cli.common import (
    KAFKA_TIMEOUT_S,
    Commands,
    bootstrap_from,
    kafka_config_from,
    positive_seconds,
    with_bootstrap,
)

if TYPE_CHECKING:
    from pyrula_stream.client.redrive import DeadLetters


def _dead_letters(args: argparse.Namespace) -> DeadLetters:
    from pyrula_stream.client.redrive import DeadLetters

    return DeadLetters(
        bootstrap_from(args),
        args.agent,
        prefix=args.prefix,
        kafka_config=kafka_config_from(args),
        timeout_s=args.timeout,
    )


def _who(args: argparse.Namespace) -> str:
    """``--by``, else the cluster login (``sasl.username``), else the OS user."""
    if args.by:
        return str(args.by)
    user = kafka_config_from(args).get("sasl.username")
    return str(user) if user else getpass.getuser()


def cmd_list(args: argparse.Namespace) -> int:
    letters = _dead_letters(args)
    for letter in letters.find(offsets=args.offset, reason=args.reason, code=args.code):
        print(json.dumps(letter.as_json(), ensure_ascii=False))
    return 0


def cmd_redrive(args: argparse.Namespace) -> int:
    letters = _dead_letters(args)
    results = letters.redrive(
        by=_who(args), offsets=args.offset, reason=args.reason, code=args.code
    )
    for result in results:
        print(json.dumps(result.as_json(), ensure_ascii=False))
    return 0


def _selectors(p: argparse.ArgumentParser) -> None:
    p.add_argument("agent")
    p.add_argument(
        "--offset", type=int, action="append", default=[], help="a dead letter's offset; repeatable"
    )
    p.add_argument("--reason", help="only dead letters whose reason contains this (any case)")
    p.add_argument("--code", help="only dead letters of this code (e.g. poison_quarantine)")
    p.add_argument("--timeout", type=positive_seconds, default=KAFKA_TIMEOUT_S)


def register(sub: Commands[argparse.ArgumentParser]) -> None:
    """``dlq list`` and ``dlq redrive``."""
    d = sub.add_parser("dlq", help="an agent's dead letters: list, redrive")
    d_sub = d.add_subparsers(dest="dlq_command", required=True)
    ls = with_bootstrap(d_sub.add_parser("list", help="AGENT: one JSON line per dead letter"))
    _selectors(ls)
    ls.set_defaults(func=cmd_list)
    r = with_bootstrap(
        d_sub.add_parser("redrive", help="AGENT --offset N ...: produce them to their source")
    )
    _selectors(r)
    r.add_argument("--by", help="who redrives (default: sasl.username, else the OS user)")
    r.set_defaults(func=cmd_redrive)
