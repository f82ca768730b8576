"""Commands about turns: submit, tail, status, threads, export and offline replay."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from typing import TYPE_CHECKING

from pyrula_stream.cli.common import (
    KAFKA_TIMEOUT_S,
    Commands,
    bootstrap_from,
    format_event,
    kafka_config_from,
    load_agent,
    parse_params,
    positive_seconds,
    with_bootstrap,
)
from pyrula_stream.errors import (
    UnknownTopicError,
)
from pyrula_stream.kafka.config import registry_config

if TYPE_CHECKING:
    from pyrula_stream.kafka.config import KafkaSettings


def no_worker_hint(
    bootstrap: str, agent: str, prefix: str, kafka_config: KafkaSettings | None = None
) -> str | None:
    """A line for a person waiting on a turn that no worker is there to run."""
    from pyrula_stream.kafka.admin import group_member_count

    group = f"{prefix}.{agent}.workers"
    if group_member_count(bootstrap, group, kafka_config=kafka_config) != 0:
        return None
    return (
        f"no worker is running for '{agent}' (consumer group {group} has no members): "
        f"start one with `pyrula-stream worker MODULE:{agent}`"
    )


def _deadline(text: str | None) -> float | str | None:
    """``--deadline``: epoch seconds or ISO 8601 text (checked by the client)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def cmd_submit(args: argparse.Namespace) -> int:
    from pyrula_stream.client.kafka_client import KafkaAgentClient

    params = parse_params(args.params)
    if args.wait and args.deferrable is None:
        args.deferrable = False  # someone waits on this turn: it stays live unless told
    bootstrap = bootstrap_from(args)
    settings = kafka_config_from(args)

    async def main() -> int:
        async with KafkaAgentClient(
            bootstrap,
            prefix=args.prefix,
            timeout=args.timeout,
            kafka_config=settings,
            serialization=args.serialization,
        ) as client:
            handle = await client.submit(
                args.agent,
                idempotency_key=args.idempotency_key,
                thread_id=args.thread,
                deferrable=args.deferrable,
                deadline=_deadline(args.deadline),
                **params,
            )
            print(handle.turn_id, flush=True)
            if not args.wait:
                return 0
            hint: list[str] = []

            async def warn_without_workers() -> None:
                await asyncio.sleep(min(3.0, args.timeout / 3))
                line = await asyncio.to_thread(
                    no_worker_hint, bootstrap, args.agent, args.prefix, settings
                )
                if line is not None:
                    hint.append(line)
                    print(f"waiting for turn {handle.turn_id}: {line}", file=sys.stderr, flush=True)

            watcher = asyncio.create_task(warn_without_workers())
            code = 0
            try:
                async for event in client.stream(
                    args.agent,
                    handle.turn_id,
                    since_ms=handle.submitted_ms - 60_000,
                    idle_timeout_seconds=args.timeout,
                ):
                    watcher.cancel()
                    print(format_event(event), flush=True)
                    if event.type == "run:error":
                        code = 1
            except TimeoutError:
                print(
                    f"error: no event of turn {handle.turn_id} within {args.timeout:g}s"
                    + (f"; {hint[0]}" if hint else "; is its worker busy or stuck?"),
                    file=sys.stderr,
                )
                return 1
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            return code

    return asyncio.run(main())


def cmd_tail(args: argparse.Namespace) -> int:
    from pyrula_stream.agent.definition import AgentTopics
    from pyrula_stream.cli.answers import answer_command
    from pyrula_stream.client.kafka_client import missing_agent_topic
    from pyrula_stream.kafka.consumers import reader_group_id
    from pyrula_stream.kafka.io import PartitionReader
    from pyrula_stream.wire.events import decode_event

    topic = AgentTopics.for_agent(args.agent, args.prefix).events
    settings = kafka_config_from(args)
    reader = PartitionReader(
        bootstrap_from(args),
        topic,
        client_id="pyrula-tail",
        timeout_s=min(args.timeout, KAFKA_TIMEOUT_S) if args.timeout else KAFKA_TIMEOUT_S,
        kafka_config=settings,
        group_id=reader_group_id(args.prefix, args.agent),
    )
    codec = None
    if registry_config(settings) is not None:
        from pyrula_stream.kafka.schema_registry import reader_codec

        codec = reader_codec(settings)
    since = None if args.from_beginning else int(time.time() * 1000) - 1000
    deadline = time.monotonic() + args.timeout if args.timeout else None
    try:
        if args.turn:
            reader.seek_key(args.turn.encode(), since)
        else:
            reader.seek_partitions(None, since)
        while deadline is None or time.monotonic() < deadline:
            for key, value, headers, _, _ in reader.poll(0.2):
                if value is None or (args.turn and key != args.turn.encode()):
                    continue
                event = decode_event(value, headers, codec)
                print(format_event(event), flush=True)
                if event.type == "run:interrupted":  # what answers it, ready to paste
                    asks = str(event.data.get("key"))
                    line = answer_command(args.agent, event.turn_id, asks)
                    print(f"  answer: {line}", flush=True)
                if args.turn and event.is_terminal:
                    return 0
    except UnknownTopicError as exc:
        raise missing_agent_topic(args.agent, args.prefix, exc.topic) from None
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()
        if codec is not None:
            codec.close()
    return 0


def cmd_turn_export(args: argparse.Namespace) -> int:
    from pyrula_stream.agent.definition import AgentTopics
    from pyrula_stream.kafka.consumers import reader_group_id
    from pyrula_stream.state.history import export_turn

    if ":" in args.agent:
        agent = load_agent(args.agent)
        topics, group = agent.topics, reader_group_id(agent.prefix, agent.name)
    else:
        topics = AgentTopics.for_agent(args.agent, args.prefix)
        group = reader_group_id(args.prefix, args.agent)
    recording = export_turn(
        bootstrap_from(args),
        history_topic=topics.history,
        events_topic=topics.events,
        turn_id=args.turn_id,
        kafka_config=kafka_config_from(args),
        group_id=group,
    )
    print(json.dumps(recording.to_json(), indent=2, ensure_ascii=False))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """One JSON line: the turn's ``TurnStatus`` (any state is an answer: exit 0)."""
    from pyrula_stream.client.kafka_client import KafkaAgentClient

    async def main() -> int:
        async with KafkaAgentClient(
            bootstrap_from(args),
            prefix=args.prefix,
            timeout=args.timeout,
            kafka_config=kafka_config_from(args),
        ) as client:
            status = await client.status(args.agent, args.turn_id, key=args.key)
        shown = dataclasses.asdict(status)
        for name in ("tenant", "resume_at"):  # only for agents with tenants, when known
            if shown[name] is None:
                del shown[name]
        print(json.dumps(shown))
        return 0

    return asyncio.run(main())


def cmd_thread(args: argparse.Namespace) -> int:
    """``thread show`` prints the thread as JSON; ``thread delete`` tombstones it."""
    from pyrula_stream.client.kafka_client import KafkaAgentClient

    async def main() -> int:
        async with KafkaAgentClient(
            bootstrap_from(args), prefix=args.prefix, kafka_config=kafka_config_from(args)
        ) as client:
            if args.thread_command == "delete":
                deleted = await client.delete_thread(
                    args.agent, args.thread_id, timeout=args.timeout
                )
                print(f"deleted thread {args.thread_id}: {deleted} turns")
                return 0
            thread = await client.get_thread(args.agent, args.thread_id)
            body = {"thread_id": thread.thread_id, "turns": [t.to_json() for t in thread.turns]}
            print(json.dumps(body, indent=2, ensure_ascii=False))
            return 0

    return asyncio.run(main())


def cmd_replay(args: argparse.Namespace) -> int:
    from pyrula_stream.runtime.replay import replay_files

    agent = load_agent(args.agent)

    async def main() -> int:
        code = 0
        for pattern in args.turns:
            for report in await replay_files(agent, pattern):
                print(report)
                code = code or (0 if report.clean else 1)
        return code

    return asyncio.run(main())


def register(sub: Commands[argparse.ArgumentParser]) -> None:
    """``submit``, ``status``, ``tail``, ``turn export``, ``thread`` and ``replay``."""
    s = with_bootstrap(sub.add_parser("submit", help="submit a turn: AGENT key=value ..."))
    s.add_argument("agent")
    s.add_argument("params", nargs="*")
    s.add_argument("--idempotency-key", default=None)
    s.add_argument("--thread", default=None)
    s.add_argument("--wait", action="store_true", help="print the turn's events until it ends")
    s.add_argument(
        "--deferrable",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the turn's model calls may wait in the agent's batch lane "
        "(docs/batch-lane.md); --wait submits --no-deferrable unless told",
    )
    s.add_argument(
        "--deadline",
        default=None,
        help="until when its calls may wait in a batch: ISO 8601 or epoch seconds",
    )
    s.add_argument(
        "--timeout",
        type=positive_seconds,
        default=KAFKA_TIMEOUT_S,
        help="seconds to wait for Kafka, and with --wait for each next event (default 30)",
    )
    s.add_argument("--serialization", default="avro", choices=["avro", "schema_registry"])
    s.set_defaults(func=cmd_submit)

    st = with_bootstrap(sub.add_parser("status", help="where a turn stands, as one JSON line"))
    st.add_argument("agent")
    st.add_argument("turn_id")
    st.add_argument(
        "--key", default=None, help="the request's key if not its turn id (e.g. the thread id)"
    )
    st.add_argument(
        "--timeout", type=positive_seconds, default=KAFKA_TIMEOUT_S, help="seconds for Kafka"
    )
    st.set_defaults(func=cmd_status)

    tl = with_bootstrap(sub.add_parser("tail", help="print an agent's events"))
    tl.add_argument("agent")
    tl.add_argument("--turn", default=None)
    tl.add_argument("--from-beginning", action="store_true")
    tl.add_argument(
        "--timeout", type=positive_seconds, default=None, help="stop after this many seconds"
    )
    tl.set_defaults(func=cmd_tail)

    tr = sub.add_parser("turn", help="recorded turns (agents with keep_history=True)")
    turn_sub = tr.add_subparsers(dest="turn_command", required=True)
    ex = with_bootstrap(turn_sub.add_parser("export", help="write a finished turn as JSON"))
    ex.add_argument("turn_id")
    ex.add_argument("--agent", required=True, help="AGENT name, or MODULE:AGENT")
    ex.set_defaults(func=cmd_turn_export)

    th = sub.add_parser("thread", help="a thread's turns: show or delete")
    thread_sub = th.add_subparsers(dest="thread_command", required=True)
    for action, text in (("show", "print its turns as JSON"), ("delete", "tombstone it")):
        ta = with_bootstrap(thread_sub.add_parser(action, help=text))
        ta.add_argument("agent")
        ta.add_argument("thread_id")
        ta.set_defaults(func=cmd_thread)
        if action == "delete":
            ta.add_argument(
                "--timeout",
                type=positive_seconds,
                default=300.0,
                help="seconds to wait for a worker to run the delete (default 300)",
            )

    rp = sub.add_parser("replay", help="run today's code against recorded turns, offline")
    rp.add_argument("agent", help="MODULE:AGENT")
    rp.add_argument("turns", nargs="+", help="turn files from `turn export` (globs allowed)")
    rp.set_defaults(func=cmd_replay)
