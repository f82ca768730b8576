"""``pyrula-stream``: broker, topics, worker, submit and tail, for people at a terminal."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyrula_stream.errors import ConfigurationError, PyrulaError
from pyrula_stream.kafka.config import registry_config

if TYPE_CHECKING:
    from pyrula_stream.kafka.config import KafkaSettings

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def load_agent(spec: str) -> Any:
    """``MODULE:AGENT`` → the ``KafkaAgent`` object (the module is imported)."""
    from pyrula_stream.agent import KafkaAgent

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"expected MODULE:AGENT, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    agent = getattr(module, attr, None)
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
    from pyrula_stream.kafka.admin import broker_answers
    from pyrula_stream.kafka.local_broker import LocalBroker, cache_root, start_local_broker

    path = state_file()
    current = LocalBroker(**json.loads(path.read_text())) if path.exists() else None
    if args.action == "start":
        if (
            current
            and current.is_running()
            and broker_answers(current.bootstrap_servers, kafka_config={})
        ):
            print(f"already running (pid {current.pid})")
            print(current.bootstrap_servers)
            return 0
        data_dir = cache_root() / "broker-data"
        broker = start_local_broker(data_dir=data_dir, port=args.port, die_with_parent=False)
        broker.owns_data_dir = True
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(broker.to_json())
        print(f"Kafka {broker.pid} started; log: {broker.log_file}")
        print(broker.bootstrap_servers)
        return 0
    if args.action == "stop":
        if current is None:
            print("no broker started by pyrula-stream")
            return 0
        current.stop()
        path.unlink(missing_ok=True)
        print("stopped")
        return 0
    if current is None or not current.is_running():
        print("not running")
        return 1
    answers = broker_answers(current.bootstrap_servers, kafka_config={})
    print(
        f"{'running' if answers else 'not answering'} pid {current.pid} "
        f"at {current.bootstrap_servers}"
    )
    return 0 if answers else 1


def agent_from(args: argparse.Namespace) -> tuple[str, str, int, set[str]]:
    """``(name, prefix, partitions, output topics)`` of ``MODULE:AGENT`` or a plain name."""
    if ":" in args.agent:
        agent = load_agent(args.agent)
        outputs = {t for topics in agent.output_topics.values() for t in topics}
        return agent.name, agent.prefix, agent.partitions, outputs
    return args.agent, args.prefix, getattr(args, "partitions", 6), set()


def cmd_topics(args: argparse.Namespace) -> int:
    from pyrula_stream.kafka.admin import agent_topic_specs, apply_topics
    from pyrula_stream.kafka.cache_store import cache_topic_spec

    name, prefix, partitions, outputs = agent_from(args)
    specs = agent_topic_specs(name, prefix=prefix, partitions=partitions)
    # The shared tool cache too, so workers without CREATE rights find every topic.
    specs.append(cache_topic_spec(prefix=prefix))
    settings = kafka_config_from(args)
    report = apply_topics(bootstrap_from(args), specs, kafka_config=settings)
    print(report.describe())
    if not report.ok:
        print("topics differ from the spec; nothing was changed", file=sys.stderr)
        return 2
    if registry_config(settings) is not None:
        from pyrula_stream.kafka.schema_registry import register_schemas

        events = sorted({f"{prefix}.{name}.events", *outputs})
        registered = register_schemas(
            settings, {"turn_request": [f"{prefix}.{name}.turns"], "event": events}
        )
        print("\n".join(f"schema  {line}" for line in registered))
    return 0


def cmd_acls(args: argparse.Namespace) -> int:
    from pyrula_stream.kafka.acls import agent_acls, apply_acls, describe

    name, prefix, _, outputs = agent_from(args)
    rules = agent_acls(
        name,
        prefix=prefix,
        worker_principal=args.worker_principal,
        client_principal=args.client_principal,
        output_topics=outputs - {f"{prefix}.{name}.events"},
    )
    print(describe(rules))
    if args.apply:
        apply_acls(bootstrap_from(args), rules, kafka_config=kafka_config_from(args))
        print(f"applied {len(rules)} ACLs")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from pyrula_stream.worker import WorkerOptions, run_worker

    agent = load_agent(args.agent)
    options = WorkerOptions(
        max_concurrent_turns=args.max_concurrent_turns,
        worker_id=args.worker_id,
        health_port=args.health_port,
        processing_guarantee=args.processing_guarantee,
        shutdown_grace=args.shutdown_grace,
        kafka_config=kafka_config_from(args),
        serialization=args.serialization,
    )
    run_worker(agent, bootstrap_from(args), options)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from pyrula_stream.client import KafkaAgentClient

    params = parse_params(args.params)

    async def main() -> int:
        async with KafkaAgentClient(
            bootstrap_from(args),
            prefix=args.prefix,
            kafka_config=kafka_config_from(args),
            serialization=args.serialization,
        ) as client:
            handle = await client.submit(
                args.agent, idempotency_key=args.idempotency_key, thread_id=args.thread, **params
            )
            print(handle.turn_id)
            if not args.wait:
                return 0
            code = 0
            async for event in client.stream(
                args.agent, handle.turn_id, since_ms=handle.submitted_ms - 60_000
            ):
                print(format_event(event))
                if event.type == "run:error":
                    code = 1
            return code

    return asyncio.run(main())


def cmd_tail(args: argparse.Namespace) -> int:
    from pyrula_stream import serde
    from pyrula_stream.agent import AgentTopics
    from pyrula_stream.kafka.consumers import reader_group_id
    from pyrula_stream.kafka.io import PartitionReader

    topic = AgentTopics.for_agent(args.agent, args.prefix).events
    reader = PartitionReader(
        bootstrap_from(args),
        topic,
        client_id="pyrula-tail",
        kafka_config=kafka_config_from(args),
        group_id=reader_group_id(args.prefix, args.agent),
    )
    codec = None
    if registry_config(kafka_config_from(args)) is not None:
        from pyrula_stream.kafka.schema_registry import reader_codec

        codec = reader_codec(kafka_config_from(args))
    since = None if args.from_beginning else int(time.time() * 1000) - 1000
    if args.turn:
        reader.seek_key(args.turn.encode(), since)
    else:
        reader.seek_partitions(None, since)
    deadline = time.monotonic() + args.timeout if args.timeout else None
    try:
        while deadline is None or time.monotonic() < deadline:
            for key, value, headers, _, _ in reader.poll(0.2):
                if value is None or (args.turn and key != args.turn.encode()):
                    continue
                event = serde.decode_event(value, headers, codec)
                print(format_event(event), flush=True)
                if args.turn and event.is_terminal:
                    return 0
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()
        if codec is not None:
            codec.close()
    return 0


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
    b.add_argument("--port", type=int, default=None)
    b.set_defaults(func=cmd_broker)

    t = with_bootstrap(sub.add_parser("topics", help="create an agent's topics, report drift"))
    t.add_argument("apply", choices=["apply"])
    t.add_argument("agent", help="AGENT name, or MODULE:AGENT to use its partitions/prefix")
    t.add_argument("--partitions", type=int, default=6)
    t.set_defaults(func=cmd_topics)

    a = with_bootstrap(sub.add_parser("acls", help="print (and --apply) an agent's least ACLs"))
    a.add_argument("agent", help="MODULE:AGENT (its prefix and output topics), or AGENT")
    a.add_argument("--worker-principal", required=True, help="e.g. User:worker")
    a.add_argument("--client-principal", default=None, help="e.g. User:client")
    a.add_argument("--apply", action="store_true", help="create them with the admin API")
    a.set_defaults(func=cmd_acls)

    w = with_bootstrap(sub.add_parser("worker", help="run an agent's turns"))
    w.add_argument("agent", help="MODULE:AGENT")
    w.add_argument("--worker-id", default=None, help="stable id (transactional.id suffix)")
    w.add_argument("--max-concurrent-turns", type=int, default=50)
    w.add_argument("--health-port", type=int, default=None)
    w.add_argument("--shutdown-grace", type=float, default=30.0)
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

    s = with_bootstrap(sub.add_parser("submit", help="submit a turn: AGENT key=value ..."))
    s.add_argument("agent")
    s.add_argument("params", nargs="*")
    s.add_argument("--idempotency-key", default=None)
    s.add_argument("--thread", default=None)
    s.add_argument("--wait", action="store_true", help="print the turn's events until it ends")
    s.add_argument("--serialization", default="avro", choices=["avro", "schema_registry"])
    s.set_defaults(func=cmd_submit)

    tl = with_bootstrap(sub.add_parser("tail", help="print an agent's events"))
    tl.add_argument("agent")
    tl.add_argument("--turn", default=None)
    tl.add_argument("--from-beginning", action="store_true")
    tl.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    tl.set_defaults(func=cmd_tail)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except PyrulaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
