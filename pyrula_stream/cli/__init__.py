"""``pyrula-stream`` (floor 9): broker, topics, worker, submit, tail and answers, for
people at a terminal."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping

from pyrula_stream._version import __version__
from pyrula_stream.cli import (
    answers,
    cluster,
    dlq,
    evals,
    gateway,
    objects,
    running,
    tenants,
    turns,
)
from pyrula_stream.cli.common import format_event, load_agent
from pyrula_stream.cli.env import from_environment
from pyrula_stream.errors import BrokerUnavailableError, ConfigurationError, PyrulaError, UserError

__all__ = ["build_parser", "format_event", "load_agent", "main"]

FROM_ENVIRONMENT = ("worker", "gateway", "ui")
"""The long-running commands, configured in a pod by ``PYRULA_*`` variables (``cli.env``)."""


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The command line; ``environ`` (default: ``os.environ``) sets the long-running
    commands' options (and ``-v``) that the command line does not."""
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="pyrula-stream", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (cluster, running, turns, answers, tenants, dlq, evals, gateway, objects):
        module.register(sub)
    errors = from_environment(parser, env)
    if errors:
        raise ConfigurationError("; ".join(errors))
    for command in FROM_ENVIRONMENT:
        command_parser = sub.choices[command]
        # Refused only when this command runs: a bad worker variable must not stop `submit`.
        command_parser.set_defaults(env_errors=from_environment(command_parser, env))
    return parser


def main(argv: list[str] | None = None) -> int:
    cli_args = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(cli_args)
    args.cli_args = cli_args
    for error in getattr(args, "env_errors", None) or ():
        print(f"error: {error}", file=sys.stderr)
    if getattr(args, "env_errors", None):
        return 2
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
