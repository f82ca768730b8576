"""``pyrula-stream`` (floor 9): broker, topics, worker, submit, tail and answers, for
people at a terminal."""

from __future__ import annotations

import argparse
import logging
import sys

from pyrula_stream.cli import answers, cluster, dlq, gateway, running, tenants, turns
from pyrula_stream.cli.common import format_event, load_agent
from pyrula_stream.errors import BrokerUnavailableError, PyrulaError, UserError

__all__ = ["build_parser", "format_event", "load_agent", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyrula-stream", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (cluster, running, turns, answers, tenants, dlq, gateway):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    cli_args = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(cli_args)
    args.cli_args = cli_args
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except BrokerUnavailableError as exc:
        print(
            f"error: {exc} (--bootstrap-servers, $KAFKA_BOOTSTRAP_SERVERS, "
            "or `pyrula-stream broker start` for a local one)",
            file=sys.stderr,
        )
        return 1
    except PyrulaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UserError) else 1
