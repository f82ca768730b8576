"""``pyrula-stream``: broker, topics, worker, submit and tail, for people at a terminal."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import json
import logging
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyrula_stream.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    PyrulaError,
    UnknownTopicError,
    UserError,
)
from pyrula_stream.kafka.config import registry_config

if TYPE_CHECKING:
    from pyrula_stream.kafka.config import KafkaSettings

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
KAFKA_TIMEOUT_S = 30.0
"""Default for ``--timeout``: how long a command waits on Kafka (and on a turn's next event)."""


def load_agent(spec: str) -> Any:
    """``MODULE:AGENT`` → the ``KafkaAgent`` object (the module is imported)."""
    from pyrula_stream.agent import KafkaAgent

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"expected MODULE:AGENT, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise ConfigurationError(
                f"no module named '{module_name}' (from {spec}): run from the directory "
                "that holds it, or add that directory to PYTHONPATH"
            ) from None
        raise ConfigurationError(f"importing '{module_name}' failed: {exc}") from None
    agent = getattr(module, attr, None)
    if agent is None:
        raise ConfigurationError(f"module '{module_name}' has no '{attr}' (from {spec})")
    if not isinstance(agent, KafkaAgent):
        raise ConfigurationError(f"{spec} is not a @kafka_agent (got {type(agent).__name__})")
    return agent


def state_file() -> Path:
    from pyrula_stream.kafka.local_broker import cache_root

    return cache_root() / "broker.json"


def kafka_config_from(args: argparse.Namespace) -> KafkaSettings:
    """--kafka-config FILE, else the file in PYRULA_KAFKA_CONFIG, else no settings."""
    from pyrula_stream.kafka.config import KafkaSettings, load_properties, resolve

    path = getattr(args, "kafka_config", None)
    return KafkaSettings(load_properties(path)) if path else resolve(None)


def bootstrap_from(args: argparse.Namespace) -> str:
    """--bootstrap-servers, else KAFKA_BOOTSTRAP_SERVERS, else the config file's
    ``bootstrap.servers``, else the broker `broker start` ran."""
    if getattr(args, "bootstrap_servers", None):
        return str(args.bootstrap_servers)
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        return env
    from_file = kafka_config_from(args).get("bootstrap.servers")
    if from_file:
        return str(from_file)
    if state_file().exists():
        return str(json.loads(state_file().read_text())["bootstrap_servers"])
    return DEFAULT_BOOTSTRAP


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; a value that parses as JSON is used as JSON, else as text."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigurationError(f"expected key=value, got {pair!r}")
        try:
            params[key] = json.loads(raw)
        except ValueError:
            params[key] = raw
    return params


def format_event(event: Any) -> str:
    """One line per event, for people."""
    data = event.data
    detail = {
        "run:start": lambda: json.dumps(data.get("params", {}), ensure_ascii=False),
        "llm:delta": lambda: repr(data.get("text", "")),
        "llm:complete": lambda: (
            f"{len(data.get('tool_calls', []))} tool call(s)"
            if data.get("tool_calls")
            else repr(data.get("text", ""))[:120]
        ),
        "tool:start": lambda: f"{data.get('tool')}({json.dumps(data.get('input', {}))})",
        "tool:result": lambda: (
            f"{data.get('tool')} {data.get('status')}: {str(data.get('output', ''))[:100]}"
        ),
        "status": lambda: str(data.get("text", "")),
        "run:complete": lambda: json.dumps(data.get("result"), ensure_ascii=False)[:200],
        "run:error": lambda: f"{data.get('code')}: {data.get('message')}",
    }.get(event.type, lambda: json.dumps(data)[:200])()
    return f"{event.turn_id[:8]} #{event.seq:<3} {event.type:<13} {detail}"


# -- commands ---------------------------------------------------------------------------


def cmd_broker(args: argparse.Namespace) -> int:
    """``start`` brings back the previous broker (same port, same topics) unless ``--fresh``;
    ``stop`` keeps its data for that."""
    from pyrula_stream.kafka.admin import broker_answers
    from pyrula_stream.kafka.local_broker import (
        LocalBroker,
        cache_root,
        port_is_free,
        start_local_broker,
    )

    path = state_file()
    current = LocalBroker(**json.loads(path.read_text())) if path.exists() else None
    running = current is not None and current.is_running()
    if args.action == "start":
        if current and running and broker_answers(current.bootstrap_servers, kafka_config={}):
            if args.fresh:
                raise ConfigurationError(
                    f"a broker is running (pid {current.pid}): run `pyrula-stream broker stop` "
                    "before `broker start --fresh`"
                )
            print(f"already running (pid {current.pid})")
            print(current.bootstrap_servers)
            return 0
        data_dir = cache_root() / "broker-data"
        port = args.port
        if args.fresh:
            shutil.rmtree(data_dir, ignore_errors=True)
            previous = int(current.bootstrap_servers.rsplit(":", 1)[1]) if current else None
            if port is None and previous is not None and port_is_free(previous):
                port = previous
        broker = start_local_broker(data_dir=data_dir, port=port, die_with_parent=False)
        broker.owns_data_dir = False  # `broker stop` keeps the data for the next start
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(broker.to_json())
        print(f"Kafka {broker.pid} started; data: {data_dir}; log: {broker.log_file}")
        print(broker.bootstrap_servers)
        return 0
    if args.action == "stop":
        if current is None or not running:
            print("no broker started by pyrula-stream is running")
            return 0
        current.halt()
        print(
            f"stopped; its data stays in {current.data_dir} for the next `broker start` "
            "(`broker start --fresh` starts an empty one)"
        )
        return 0
    if current is None or not running:
        where = f" (last at {current.bootstrap_servers})" if current else ""
        print(f"not running{where}; `pyrula-stream broker start` starts it")
        return 1
    answers = broker_answers(current.bootstrap_servers, kafka_config={})
    print(
        f"{'running' if answers else 'not answering'} pid {current.pid} "
        f"at {current.bootstrap_servers}"
    )
    return 0 if answers else 1


def agent_from(args: argparse.Namespace) -> tuple[str, str, set[str], bool]:
    """``(name, prefix, output topics, keep_history)`` of ``MODULE:AGENT`` or a plain name."""
    if ":" in args.agent:
        agent = load_agent(args.agent)
        outputs = {t for topics in agent.output_topics.values() for t in topics}
        return agent.name, agent.prefix, outputs, agent.keep_history
    return args.agent, args.prefix, set(), bool(getattr(args, "keep_history", False))


def cmd_topics(args: argparse.Namespace) -> int:
    from pyrula_stream.kafka.admin import agent_topic_specs, apply_topics
    from pyrula_stream.kafka.cache_store import cache_topic_spec
    from pyrula_stream.kafka.memory_store import memory_topic_spec

    if ":" in args.agent:
        agent = load_agent(args.agent)
        name, prefix = agent.name, agent.prefix
        events = sorted(agent.event_routing.all_topics())
        specs = agent.topic_specs()
    else:
        name, prefix = args.agent, args.prefix
        events = [f"{prefix}.{name}.events"]
        specs = agent_topic_specs(
            args.agent,
            prefix=args.prefix,
            partitions=args.partitions,
            keep_history=args.keep_history,
        )
    # The shared tool cache and memory too, so workers without CREATE rights find them.
    specs += [cache_topic_spec(prefix=prefix), memory_topic_spec(prefix=prefix)]
    settings = kafka_config_from(args)
    report = apply_topics(bootstrap_from(args), specs, kafka_config=settings)
    print(report.describe())
    if not report.ok:
        print("topics differ from the spec; nothing was changed", file=sys.stderr)
        return 2
    if registry_config(settings) is not None:
        from pyrula_stream.kafka.schema_registry import register_schemas

        registered = register_schemas(
            settings, {"turn_request": [f"{prefix}.{name}.turns"], "event": events}
        )
        print("\n".join(f"schema  {line}" for line in registered))
    return 0


def cmd_acls(args: argparse.Namespace) -> int:
    from pyrula_stream.kafka.acls import agent_acls, apply_acls, describe

    name, prefix, outputs, keep_history = agent_from(args)
    rules = agent_acls(
        name,
        prefix=prefix,
        worker_principal=args.worker_principal,
        client_principal=args.client_principal,
        output_topics=outputs - {f"{prefix}.{name}.events", f"{prefix}.{name}.results"},
        keep_history=keep_history,
        calls=args.calls,
        called_by=args.called_by,
    )
    print(describe(rules))
    if args.apply:
        apply_acls(bootstrap_from(args), rules, kafka_config=kafka_config_from(args))
        print(f"applied {len(rules)} ACLs")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    """The JSON Schema of the agent's result (the ``result`` field of its result records)."""
    agent = load_agent(args.agent)
    if agent.output is None:
        raise ConfigurationError(
            f"agent '{agent.name}' has no output_type, so its result is any JSON value; "
            "bind it with @kafka_agent(output_type=...) to publish a schema"
        )
    print(json.dumps(agent.output.json_schema(), indent=2, sort_keys=True))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from pyrula_stream.observability import logs, tracing
    from pyrula_stream.runtime.worker import WorkerOptions, run_worker

    logs.configure(logging.INFO if args.verbose else logging.WARNING, args.log_format)
    agents = [load_agent(spec) for spec in args.agent]
    if args.processes is not None:
        from pyrula_stream.supervisor import process_count, run_supervisor

        try:
            count = process_count(args.processes)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        base_id = args.worker_id or socket.gethostname()
        return run_supervisor(args.cli_args, count=count, base_id=base_id)
    tracing.otlp_from_environment("pyrula-stream")
    options = WorkerOptions(
        max_concurrent_turns=args.max_concurrent_turns,
        worker_id=args.worker_id,
        health_port=args.health_port,
        processing_guarantee=args.processing_guarantee,
        shutdown_grace=args.shutdown_grace,
        static_membership=args.static_membership,
        group_protocol=args.group_protocol,
        kafka_config=kafka_config_from(args),
        serialization=args.serialization,
    )
    run_worker(agents[0] if len(agents) == 1 else agents, bootstrap_from(args), options)
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    """``mcp serve``: each agent becomes one MCP tool that runs a turn on Kafka."""
    from pyrula_stream.mcp.serve import build_mcp_server, serve_http, serve_stdio

    agents = [load_agent(spec) for spec in args.agents]
    server = build_mcp_server(
        agents=agents,
        bootstrap_servers=bootstrap_from(args),
        name=args.name or agents[0].name,
        kafka_config=kafka_config_from(args),
    )
    if args.http is None:
        asyncio.run(serve_stdio(server))  # stdout is the protocol: nothing else prints there
    else:
        print(f"serving MCP at http://{args.host}:{args.http}/mcp", file=sys.stderr)
        asyncio.run(serve_http(server, host=args.host, port=args.http))
    return 0


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


def cmd_submit(args: argparse.Namespace) -> int:
    from pyrula_stream.client import KafkaAgentClient

    params = parse_params(args.params)
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
                args.agent, idempotency_key=args.idempotency_key, thread_id=args.thread, **params
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
    from pyrula_stream.agent import AgentTopics
    from pyrula_stream.client import missing_agent_topic
    from pyrula_stream.events import decode_event
    from pyrula_stream.kafka.consumers import reader_group_id
    from pyrula_stream.kafka.io import PartitionReader

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


def cmd_ui(args: argparse.Namespace) -> int:
    try:
        from pyrula_stream.ui.feed import FeedOptions
        from pyrula_stream.ui.server import UIOptions, serve_ui
    except ImportError as exc:
        raise ConfigurationError(
            f"the web UI needs the ui extra: pip install 'pyrula-stream[ui]' ({exc})"
        ) from None
    feed = FeedOptions(
        bootstrap_from(args),
        prefix=args.prefix,
        agents=tuple(args.agent) if args.agent else None,
        history_s=args.history_minutes * 60,
        kafka_config=kafka_config_from(args),
    )
    options = UIOptions(
        host=args.host, port=args.port, allow_actions=args.allow_actions, max_turns=args.max_turns
    )
    print(f"pyrula-stream ui on http://{args.host}:{args.port}", flush=True)
    # uvicorn shuts down gracefully on Ctrl-C, then raises it again for the caller.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_ui(feed, options))
    return 0


def cmd_turn_export(args: argparse.Namespace) -> int:
    from pyrula_stream.agent import AgentTopics
    from pyrula_stream.history import export_turn
    from pyrula_stream.kafka.consumers import reader_group_id

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
    from pyrula_stream.client import KafkaAgentClient

    async def main() -> int:
        async with KafkaAgentClient(
            bootstrap_from(args),
            prefix=args.prefix,
            timeout=args.timeout,
            kafka_config=kafka_config_from(args),
        ) as client:
            status = await client.status(args.agent, args.turn_id, key=args.key)
        print(json.dumps(dataclasses.asdict(status)))
        return 0

    return asyncio.run(main())


def cmd_thread(args: argparse.Namespace) -> int:
    """``thread show`` prints the thread as JSON; ``thread delete`` tombstones it."""
    from pyrula_stream.client import KafkaAgentClient

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
    from pyrula_stream.replay import replay_files

    agent = load_agent(args.agent)

    async def main() -> int:
        code = 0
        for pattern in args.turns:
            for report in await replay_files(agent, pattern):
                print(report)
                code = code or (0 if report.clean else 1)
        return code

    return asyncio.run(main())


def positive_seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyrula-stream", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_bootstrap(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--bootstrap-servers",
            help="default: $KAFKA_BOOTSTRAP_SERVERS, "
            "else the broker `broker start` ran, else 127.0.0.1:9092",
        )
        p.add_argument(
            "--kafka-config",
            metavar="FILE",
            help="librdkafka client properties (key=value, # comments) for every client: "
            "security.protocol, sasl.*, ssl.*, client.id; default: $PYRULA_KAFKA_CONFIG",
        )
        p.add_argument("--prefix", default="pyrula")
        return p

    b = sub.add_parser("broker", help="a local single-node Kafka broker (no Docker)")
    b.add_argument("action", choices=["start", "stop", "status"])
    b.add_argument(
        "--port",
        type=int,
        default=None,
        help="default: the previous broker's port, else a free one",
    )
    b.add_argument(
        "--fresh", action="store_true", help="start an empty broker (deletes the previous data)"
    )
    b.set_defaults(func=cmd_broker)

    t = with_bootstrap(sub.add_parser("topics", help="create an agent's topics, report drift"))
    t.add_argument("apply", choices=["apply"])
    t.add_argument("agent", help="AGENT name, or MODULE:AGENT to use its partitions/prefix")
    t.add_argument("--partitions", type=int, default=6)
    t.add_argument(
        "--keep-history", action="store_true", help="also <agent>.history (keep_history=True)"
    )
    t.set_defaults(func=cmd_topics)

    sc = sub.add_parser("schema", help="print the JSON Schema of an agent's result")
    sc.add_argument("agent", help="MODULE:AGENT")
    sc.set_defaults(func=cmd_schema)

    a = with_bootstrap(sub.add_parser("acls", help="print (and --apply) an agent's least ACLs"))
    a.add_argument("agent", help="MODULE:AGENT (its prefix and output topics), or AGENT")
    a.add_argument("--worker-principal", required=True, help="e.g. User:worker")
    a.add_argument("--client-principal", default=None, help="e.g. User:client")
    a.add_argument("--apply", action="store_true", help="create them with the admin API")
    a.add_argument(
        "--calls",
        action="append",
        default=[],
        metavar="AGENT",
        help="a sub-agent it calls (write its turns and control topics); repeatable",
    )
    a.add_argument(
        "--called-by",
        action="append",
        default=[],
        metavar="AGENT",
        help="an agent that calls it as a sub-agent (write that agent's replies); repeatable",
    )
    a.add_argument(
        "--keep-history", action="store_true", help="the agent keeps history (AGENT only)"
    )
    a.set_defaults(func=cmd_acls)

    w = with_bootstrap(sub.add_parser("worker", help="run an agent's turns"))
    w.add_argument("agent", nargs="+", help="MODULE:AGENT, one or more (one process runs them all)")
    w.add_argument("--worker-id", default=None, help="stable id (transactional.id suffix)")
    w.add_argument(
        "--processes",
        default=None,
        help="N or auto (one per core): supervise N worker processes with ids "
        "<worker-id>-0..N-1; a child that dies is restarted",
    )
    w.add_argument("--max-concurrent-turns", type=int, default=50)
    w.add_argument(
        "--health-port", type=int, default=None, help="serve /livez, /readyz and /metrics"
    )
    w.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="json: one object per line with agent, turn_id, attempt, partition, worker_id",
    )
    w.add_argument("--shutdown-grace", type=float, default=30.0)
    w.add_argument(
        "--static-membership",
        action="store_true",
        help="use --worker-id as group.instance.id: a restart gets its partitions back at "
        "once (a worker stopped for good idles them until the session timeout)",
    )
    w.add_argument(
        "--group-protocol",
        default="classic",
        choices=["classic", "consumer"],
        help="consumer = the KIP-848 rebalance protocol (Kafka 4.0+)",
    )
    w.add_argument(
        "--processing-guarantee",
        default="exactly_once_v2",
        choices=["exactly_once_v2", "at_least_once"],
    )
    w.add_argument(
        "--serialization",
        default="avro",
        choices=["avro", "schema_registry"],
        help="schema_registry: Confluent wire format via schema.registry.url in --kafka-config",
    )
    w.set_defaults(func=cmd_worker)

    m = sub.add_parser("mcp", help="Model Context Protocol")
    m_sub = m.add_subparsers(dest="mcp_command", required=True)
    ms = with_bootstrap(
        m_sub.add_parser("serve", help="expose agents as MCP tools (stdio, or --http PORT)")
    )
    ms.add_argument("agents", nargs="+", metavar="MODULE:AGENT")
    ms.add_argument("--http", type=int, default=None, metavar="PORT", help="streamable HTTP")
    ms.add_argument("--host", default="127.0.0.1")
    ms.add_argument("--name", default=None, help="the server's name (default: the first agent)")
    ms.set_defaults(func=cmd_mcp)

    s = with_bootstrap(sub.add_parser("submit", help="submit a turn: AGENT key=value ..."))
    s.add_argument("agent")
    s.add_argument("params", nargs="*")
    s.add_argument("--idempotency-key", default=None)
    s.add_argument("--thread", default=None)
    s.add_argument("--wait", action="store_true", help="print the turn's events until it ends")
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

    u = with_bootstrap(sub.add_parser("ui", help="a live web view of turns and the DLQ"))
    u.add_argument(
        "--agent", action="append", default=None, help="repeatable; default: every agent found"
    )
    u.add_argument("--port", type=int, default=8088)
    u.add_argument("--host", default="127.0.0.1", help="bind address")
    u.add_argument(
        "--allow-actions", action="store_true", help="allow cancel/terminate from the page"
    )
    u.add_argument("--history-minutes", type=float, default=60.0, help="how far back to read")
    u.add_argument("--max-turns", type=int, default=200, help="turns kept per agent")
    u.set_defaults(func=cmd_ui)
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


if __name__ == "__main__":
    raise SystemExit(main())
