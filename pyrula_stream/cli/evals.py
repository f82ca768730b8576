"""``pyrula-stream evals run MODULE:AGENT``: the agent's evaluators as a consumer group of
their own (``evals.stream``), until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import TYPE_CHECKING, Any

from pyrula_stream.cli.common import bootstrap_from, kafka_config_from, load_agent, with_bootstrap
from pyrula_stream.errors import ConfigurationError

if TYPE_CHECKING:
    from argparse import _SubParsersAction as Commands


def cmd_run(args: argparse.Namespace) -> int:
    from pyrula_stream.evals.stream.runner import EvalStream

    agent = load_agent(args.agent)
    if not agent.evaluators:
        raise ConfigurationError(
            f"agent '{agent.name}' declares no evaluators: @kafka_agent(evaluators=[...])"
        )
    stream = EvalStream(
        agent,
        bootstrap_from(args),
        instance=args.instance,
        kafka_config=kafka_config_from(args),
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


def register(sub: Commands[argparse.ArgumentParser]) -> None:
    """``evals run``."""
    e = sub.add_parser("evals", help="score an agent's turns: run its evaluators")
    e_sub = e.add_subparsers(dest="evals_command", required=True)
    r = with_bootstrap(
        e_sub.add_parser("run", help="MODULE:AGENT: run its evaluators (their own group)")
    )
    r.add_argument("agent", help="MODULE:AGENT, an agent with evaluators=[...]")
    r.add_argument(
        "--instance",
        default=None,
        help="this member's stable name (its transactional id): a restarted member with "
        "the same name fences its dead self at once (default: host, pid, random)",
    )
    r.add_argument(
        "--static-membership",
        action="store_true",
        help="join as a static member (group.instance.id = --instance): a restarted member "
        "gets its partitions back at once (a pod restarted in place)",
    )
    r.set_defaults(func=cmd_run)
