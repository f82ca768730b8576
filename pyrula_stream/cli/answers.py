"""Commands for a person in the loop: ``signal`` a waiting turn, ``approve``/``reject`` a
question it asked, list the ``pending`` questions."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from pyrula_stream.cli.common import (
    KAFKA_TIMEOUT_S,
    Commands,
    bootstrap_from,
    kafka_config_from,
    parse_params,
    positive_seconds,
    with_bootstrap,
)
from pyrula_stream.errors import SignalRefused


def _client(args: argparse.Namespace) -> Any:
    from pyrula_stream.client.kafka_client import KafkaAgentClient

    return KafkaAgentClient(
        bootstrap_from(args),
        prefix=args.prefix,
        timeout=args.timeout,
        kafka_config=kafka_config_from(args),
    )


def _undecided(what: str, watched: bool = True) -> None:
    if not watched:
        print(
            f"{what} sent; this principal may not read the journal and dead letters, so "
            "the worker's decision is not shown (follow the turn's events)",
            file=sys.stderr,
        )
        return
    print(
        f"{what} sent, but no worker decided on it within the timeout: it stays on the topic "
        "and is taken (or refused) when a worker for the agent runs",
        file=sys.stderr,
    )


def cmd_signal(args: argparse.Namespace) -> int:
    """Exit 0 when the turn's worker took the signal, 3 when it refused it, 4 when no
    worker decided in time."""
    payload = parse_params(args.payload) if args.payload else None

    async def main() -> int:
        async with _client(args) as client:
            try:
                receipt = await client.signal(
                    args.agent, args.turn_id, args.name, payload, key=args.key, sender=args.sender
                )
            except SignalRefused as exc:
                print(f"refused ({exc.reason}): {exc}", file=sys.stderr)
                return 3
        if not receipt.accepted:
            _undecided(f"signal {receipt.signal.signal_id}", receipt.watched)
            return 4
        print(json.dumps({"signal_id": receipt.signal.signal_id, "accepted": True}))
        return 0

    return asyncio.run(main())


def cmd_answer(args: argparse.Namespace) -> int:
    """``approve``/``reject``: exit 0 when the answer was taken, 3 when refused (already
    answered, or the turn ended or is unknown), 4 when no worker decided in time."""

    async def main() -> int:
        async with _client(args) as client:
            answer = client.approve if args.command == "approve" else client.reject
            try:
                receipt = await answer(
                    args.agent,
                    args.turn_id,
                    args.question_key,
                    reason=args.reason,
                    turn_key=args.key,
                    sender=args.sender,
                )
            except SignalRefused as exc:
                print(f"refused ({exc.reason}): {exc}", file=sys.stderr)
                return 3
        if not receipt.accepted:
            _undecided(f"answer to {args.question_key}", receipt.watched)
            return 4
        print(json.dumps({"key": args.question_key, "answer": args.command, "accepted": True}))
        return 0

    return asyncio.run(main())


def cmd_pending(args: argparse.Namespace) -> int:
    """One JSON line per open question, oldest first."""

    async def main() -> int:
        async with _client(args) as client:
            for question in await client.pending(args.agent):
                print(json.dumps(question.as_dict(), ensure_ascii=False))
        return 0

    return asyncio.run(main())


def answer_command(agent: str, turn_id: str, key: str) -> str:
    """The command that answers a ``run:interrupted`` question (``tail`` prints it)."""
    return f"pyrula-stream approve|reject {agent} {turn_id} {key} [--reason TEXT]"


def _common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--key", default=None, help="the request's key if not its turn id (thread id)")
    p.add_argument("--as", dest="sender", default=None, help="who answers (default: your user)")
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=KAFKA_TIMEOUT_S,
        help="seconds for Kafka and for the worker's decision (default 30)",
    )
    return p


def register(sub: Commands[argparse.ArgumentParser]) -> None:
    """``signal``, ``approve``, ``reject`` and ``pending``."""
    s = _common(with_bootstrap(sub.add_parser("signal", help="send a signal to a waiting turn")))
    s.add_argument("agent")
    s.add_argument("turn_id")
    s.add_argument("name")
    s.add_argument("payload", nargs="*", help="key=value pairs: the signal's JSON payload")
    s.set_defaults(func=cmd_signal)
    for action, text in (
        ("approve", "approve a question a turn parked on (a gated tool call runs)"),
        ("reject", "reject a question a turn parked on (the call does not run)"),
    ):
        a = _common(with_bootstrap(sub.add_parser(action, help=text)))
        a.add_argument("agent")
        a.add_argument("turn_id")
        a.add_argument("question_key", help="the question's key, e.g. tool_approval:refund#0.0")
        a.add_argument("--reason", default=None, help="why (recorded on the tool:result)")
        a.set_defaults(func=cmd_answer)
    p = with_bootstrap(sub.add_parser("pending", help="the open questions of an agent's turns"))
    p.add_argument("agent")
    p.add_argument(
        "--timeout", type=positive_seconds, default=KAFKA_TIMEOUT_S, help="seconds for Kafka"
    )
    p.set_defaults(func=cmd_pending)
