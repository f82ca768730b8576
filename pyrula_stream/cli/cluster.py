"""Commands that set a cluster up for an agent: a local broker, topics, ACLs, result schema."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from pyrula_stream.cli.common import (
    Commands,
    bootstrap_from,
    kafka_config_from,
    load_agent,
    state_file,
    with_bootstrap,
)
from pyrula_stream.errors import (
    ConfigurationError,
)
from pyrula_stream.kafka.config import registry_config


def cmd_broker(args: argparse.Namespace) -> int:
    """``start`` brings back the previous broker (same port, same topics) unless ``--fresh``;
    ``stop`` keeps its data for that."""
    from pyrula_stream.kafka.admin import broker_answers
    from pyrula_stream.kafka.local.broker import (
        LocalBroker,
        cache_root,
        port_is_free,
        start_local_broker,
    )

    if args.brokers > 1 or (args.action != "start" and cluster_state_file().exists()):
        return cmd_local_cluster(args)
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


def cluster_state_file() -> Path:
    from pyrula_stream.kafka.local.broker import cache_root

    return cache_root() / "cluster.json"


def cmd_local_cluster(args: argparse.Namespace) -> int:
    """``broker start --brokers N``: a local cluster of N brokers and a controller, kept
    across ``stop``/``start`` as the single broker is (``kafka/local_cluster.py``)."""
    from pyrula_stream.kafka.admin import broker_answers
    from pyrula_stream.kafka.local.broker import cache_root
    from pyrula_stream.kafka.local.cluster import LocalCluster, start_local_cluster

    path = cluster_state_file()
    current = LocalCluster.from_json(path.read_text()) if path.exists() else None
    if args.action == "start":
        if current is not None and current.running():
            if args.fresh:
                raise ConfigurationError(
                    "a local cluster is running: run `pyrula-stream broker stop` before "
                    "`broker start --fresh`"
                )
            print(f"already running (brokers {current.running()})")
            print(current.bootstrap_servers)
            return 0
        data_dir = cache_root() / "cluster-data"
        if args.fresh:
            shutil.rmtree(data_dir, ignore_errors=True)
        cluster = start_local_cluster(args.brokers, data_dir=data_dir, die_with_parent=False)
        cluster.owns_data_dir = False
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(cluster.to_json())
        print(f"Kafka cluster of {args.brokers} brokers started; data: {data_dir}")
        print(cluster.bootstrap_servers)
        return 0
    assert current is not None
    if args.action == "stop":
        current.halt()
        print(f"stopped; its data stays in {current.data_dir} for the next `broker start`")
        path.unlink()
        return 0
    for i, node in enumerate(current.brokers, start=1):
        up = node.is_running() and broker_answers(node.bootstrap_servers, kafka_config={})
        print(f"broker {i} {'running' if up else 'down'} at {node.bootstrap_servers}")
    return 0 if current.running() else 1


def agent_from(args: argparse.Namespace) -> tuple[str, str, set[str], bool, str | None]:
    """``(name, prefix, output topics, keep_history, trust_domain)`` of ``MODULE:AGENT``
    or a plain name (whose flags say the rest)."""
    if ":" in args.agent:
        agent = load_agent(args.agent)
        outputs = {t for topics in agent.output_topics.values() for t in topics}
        return agent.name, agent.prefix, outputs, agent.keep_history, agent.trust_domain
    keep = bool(getattr(args, "keep_history", False))
    return args.agent, args.prefix, set(), keep, getattr(args, "trust_domain", None)


def cmd_topics(args: argparse.Namespace) -> int:
    from pyrula_stream.client.redrive import redrive_topic_spec
    from pyrula_stream.kafka.acls import shared_prefix
    from pyrula_stream.kafka.admin import agent_topic_specs, apply_topics, weak_exactly_once
    from pyrula_stream.kafka.stores.cache import cache_topic_spec
    from pyrula_stream.kafka.stores.memory import memory_topic_spec

    if ":" in args.agent:
        agent = load_agent(args.agent)
        name, prefix = agent.name, agent.prefix
        shared = agent.shared_prefix
        events = sorted(agent.event_routing.all_topics())
        specs = agent.topic_specs()
    else:
        name, prefix = args.agent, args.prefix
        shared = shared_prefix(prefix, args.trust_domain)
        events = [f"{prefix}.{name}.events"]
        specs = agent_topic_specs(
            args.agent,
            prefix=args.prefix,
            partitions=args.partitions,
            keep_history=args.keep_history,
        )
    # The shared tool cache and memory too, so workers without CREATE rights find them,
    # and the operators' notes of redriven dead letters.
    specs += [cache_topic_spec(prefix=shared), memory_topic_spec(prefix=shared)]
    specs += [redrive_topic_spec(name, prefix)]
    settings = kafka_config_from(args)
    report = apply_topics(bootstrap_from(args), specs, kafka_config=settings)
    print(report.describe())
    for weakness in weak_exactly_once(bootstrap_from(args), kafka_config=settings):
        print(f"WARNING exactly-once is weaker than it looks: {weakness}", file=sys.stderr)
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


def evaluated_topics(agent: Any) -> tuple[list[str], list[str]]:
    """The judges an agent's evaluators ask, and the business topics they read."""
    from pyrula_stream.evals import JudgeEvaluator, OutcomeEvaluator

    evaluators = getattr(agent, "evaluators", ())
    judges = sorted({e.judge for e in evaluators if isinstance(e, JudgeEvaluator)})
    topics = sorted({e.topic for e in evaluators if isinstance(e, OutcomeEvaluator)})
    return judges, topics


def cmd_acls(args: argparse.Namespace) -> int:
    from pyrula_stream.kafka.acls import agent_acls, apply_acls, describe

    name, prefix, outputs, keep_history, trust_domain = agent_from(args)
    loaded = load_agent(args.agent) if ":" in args.agent else None
    tenants = loaded is not None and loaded.tenancy.enabled
    judges, outcome_topics = evaluated_topics(loaded)
    rules = agent_acls(
        name,
        prefix=prefix,
        worker_principal=args.worker_principal,
        client_principal=args.client_principal,
        status_principal=args.status_principal,
        gateway_principal=args.gateway_principal,
        reviewer_principal=args.reviewer_principal,
        operator_principal=args.operator_principal,
        tenants=tenants or args.tenants,
        output_topics=outputs - {f"{prefix}.{name}.events", f"{prefix}.{name}.results"},
        keep_history=keep_history,
        calls=args.calls,
        called_by=args.called_by,
        trust_domain=trust_domain,
        idempotent_write=args.idempotent_write,
        evaluator_principal=args.evaluator_principal,
        judges=judges,
        outcome_topics=outcome_topics,
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


def register(sub: Commands[argparse.ArgumentParser]) -> None:
    """``broker``, ``topics``, ``schema`` and ``acls``."""
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
    b.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="start a local cluster of this many brokers (and one controller)",
    )
    b.set_defaults(func=cmd_broker)

    t = with_bootstrap(sub.add_parser("topics", help="create an agent's topics, report drift"))
    t.add_argument("apply", choices=["apply"])
    t.add_argument("agent", help="AGENT name, or MODULE:AGENT to use its partitions/prefix")
    t.add_argument("--partitions", type=int, default=6)
    t.add_argument(
        "--keep-history", action="store_true", help="also <agent>.history (keep_history=True)"
    )
    t.add_argument(
        "--trust-domain",
        default=None,
        help="create <prefix>.<domain>.memory/.cache instead of the shared ones (AGENT only)",
    )
    t.set_defaults(func=cmd_topics)

    sc = sub.add_parser("schema", help="print the JSON Schema of an agent's result")
    sc.add_argument("agent", help="MODULE:AGENT")
    sc.set_defaults(func=cmd_schema)

    a = with_bootstrap(sub.add_parser("acls", help="print (and --apply) an agent's least ACLs"))
    a.add_argument("agent", help="MODULE:AGENT (its prefix and output topics), or AGENT")
    a.add_argument("--worker-principal", required=True, help="e.g. User:worker")
    a.add_argument(
        "--client-principal", default=None, help="submits and reads events, e.g. User:client"
    )
    a.add_argument(
        "--status-principal",
        default=None,
        help="reads requests, journal and threads (status, get_thread), e.g. User:status",
    )
    a.add_argument(
        "--gateway-principal",
        default=None,
        help="pyrula-stream gateway: submits, streams, reads requests and status, "
        "e.g. User:gateway",
    )
    a.add_argument(
        "--reviewer-principal",
        default=None,
        help="answers questions (approve, reject, resume): the only writer of "
        "<agent>.answers, e.g. User:reviewer",
    )
    a.add_argument(
        "--operator-principal",
        default=None,
        help="writes the tenants' limits (pyrula-stream tenants set) and redrives dead "
        "letters to turns and signals (pyrula-stream dlq), e.g. User:ops",
    )
    a.add_argument(
        "--evaluator-principal",
        default=None,
        help="runs the agent's evaluators (pyrula-stream evals run): reads results, "
        "writes <agent>.scores, asks its judges, e.g. User:evals",
    )
    a.add_argument(
        "--tenants",
        action="store_true",
        help="the agent has tenants (AGENT only): workers read <agent>.tenants and share "
        "<agent>.tenant-usage",
    )
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
        "--callers",
        dest="called_by",
        action="append",
        default=[],
        metavar="AGENT",
        help="an agent that may call it as a sub-agent: its worker writes that agent's "
        "replies topic and no other; repeatable",
    )
    a.add_argument(
        "--keep-history", action="store_true", help="the agent keeps history (AGENT only)"
    )
    a.add_argument(
        "--trust-domain",
        default=None,
        help="its memory and tool cache are <prefix>.<domain>.* (AGENT only)",
    )
    a.add_argument(
        "--idempotent-write",
        action="store_true",
        help="also grant CLUSTER IDEMPOTENT_WRITE (only brokers before Kafka 3.0 need it)",
    )
    a.set_defaults(func=cmd_acls)
