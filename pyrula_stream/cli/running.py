"""Commands that run something long-lived: a worker, an MCP server, the web UI."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import sys

from pyrula_stream.cli.common import (
    Commands,
    access_from,
    add_access_arguments,
    add_object_store_argument,
    bootstrap_from,
    kafka_config_from,
    load_agent,
    warn_if_open,
    with_bootstrap,
)
from pyrula_stream.errors import (
    ConfigurationError,
)
from pyrula_stream.runtime.event_loop import EVENT_LOOPS
from pyrula_stream.runtime.options import SHUTDOWN_GRACE_S
from pyrula_stream.wire.payload_refs import DEFAULT_THRESHOLD


def cmd_worker(args: argparse.Namespace) -> int:
    from pyrula_stream.access.tenant_signature import load_tenant_key
    from pyrula_stream.observability import logs, tracing
    from pyrula_stream.runtime.mesh import run_worker
    from pyrula_stream.runtime.options import WorkerOptions

    logs.configure(logging.INFO if args.verbose else logging.WARNING, args.log_format)
    agents = [load_agent(spec) for spec in args.agent]
    if args.processes is not None:
        from pyrula_stream.runtime.supervisor import process_count, run_supervisor

        try:
            count = process_count(args.processes)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        base_id = args.worker_id or socket.gethostname()
        return run_supervisor(
            args.cli_args, count=count, base_id=base_id, health_port=args.health_port
        )
    tracing.otlp_from_environment("pyrula-stream")
    options = WorkerOptions(
        max_concurrent_turns=args.max_concurrent_turns,
        worker_id=args.worker_id,
        health_port=args.health_port,
        health_host=args.health_host,
        processing_guarantee=args.processing_guarantee,
        shutdown_grace=args.shutdown_grace,
        static_membership=args.static_membership,
        group_protocol=args.group_protocol,
        kafka_config=kafka_config_from(args),
        serialization=args.serialization,
        tenant_key=load_tenant_key(args.tenant_key_file) if args.tenant_key_file else None,
        object_store=args.object_store or None,
        offload_threshold_bytes=args.offload_threshold_bytes,
    )
    run_worker(
        agents[0] if len(agents) == 1 else agents,
        bootstrap_from(args),
        options,
        event_loop=args.event_loop,
    )
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    """``mcp serve``: each agent becomes one MCP tool that runs a turn on Kafka."""
    from pyrula_stream.access.http_guard import check_bind
    from pyrula_stream.integrations.mcp_server import (
        MCP_EXPOSES,
        build_mcp_server,
        serve_http,
        serve_stdio,
    )

    stdio_only = args.http is None
    if stdio_only and (args.api_keys or args.allowed_hosts or args.allow_unauthenticated):
        raise ConfigurationError(
            "--api-keys, --allowed-hosts and --allow-unauthenticated apply to --http PORT; "
            "over stdio only the process that started the server can reach it"
        )
    agents = [load_agent(spec) for spec in args.agents]
    access = access_from(args)
    server = build_mcp_server(
        agents=agents,
        bootstrap_servers=bootstrap_from(args),
        name=args.name or agents[0].name,
        kafka_config=kafka_config_from(args),
    )
    if stdio_only:
        asyncio.run(serve_stdio(server))  # stdout is the protocol: nothing else prints there
    else:
        check_bind(args.host, access, exposes=MCP_EXPOSES)  # before saying it serves
        warn_if_open(args.host, access)
        print(f"serving MCP at http://{args.host}:{args.http}/mcp", file=sys.stderr)
        asyncio.run(serve_http(server, host=args.host, port=args.http, access=access))
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    try:
        from pyrula_stream.access.http_guard import check_bind
        from pyrula_stream.ui.feed import FeedOptions
        from pyrula_stream.ui.server import UIOptions, exposure, serve_ui
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
        object_store=args.object_store or None,
    )
    access = access_from(args)
    options = UIOptions(
        host=args.host,
        port=args.port,
        allow_actions=args.allow_actions,
        max_turns=args.max_turns,
        reviewers=frozenset(args.reviewer) if args.reviewer else None,
        operators=frozenset(args.operator) if args.operator else None,
        access=access,
    )
    check_bind(args.host, access, exposes=exposure(options))  # before saying it serves
    warn_if_open(args.host, access)
    print(f"pyrula-stream ui on http://{args.host}:{args.port}", flush=True)
    # uvicorn shuts down gracefully on Ctrl-C, then raises it again for the caller.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_ui(feed, options))
    return 0


def register(sub: Commands[argparse.ArgumentParser]) -> None:
    """``worker``, ``mcp serve`` and ``ui``."""
    w = with_bootstrap(sub.add_parser("worker", help="run an agent's turns"))
    w.add_argument("agent", nargs="+", help="MODULE:AGENT, one or more (one process runs them all)")
    w.add_argument("--worker-id", default=None, help="stable id (transactional.id suffix)")
    w.add_argument(
        "--processes",
        default=None,
        help="N or auto (one per core the container may use: its cgroup CPU limit, else "
        "the cores): supervise N worker processes with ids "
        "<worker-id>-0..N-1; a child that dies is restarted",
    )
    w.add_argument("--max-concurrent-turns", type=int, default=50)
    w.add_argument(
        "--health-port", type=int, default=None, help="serve /livez, /readyz and /metrics"
    )
    w.add_argument(
        "--health-host",
        default="127.0.0.1",
        help="the address of --health-port; a pod's probes and Prometheus need 0.0.0.0",
    )
    w.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="json: one object per line with agent, turn_id, attempt, partition, worker_id",
    )
    w.add_argument(
        "--shutdown-grace",
        type=float,
        default=SHUTDOWN_GRACE_S,
        help=f"seconds SIGTERM waits for running turns (default {SHUTDOWN_GRACE_S:g}: under "
        "Kubernetes' default 30 s grace period; a pod's terminationGracePeriodSeconds must "
        "exceed it)",
    )
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
    w.add_argument(
        "--event-loop",
        default=None,
        choices=list(EVENT_LOOPS),
        help="the worker's event loop (default: $PYRULA_EVENT_LOOP, else asyncio); uvloop: "
        "less CPU per short turn, more per step of a very long one",
    )
    w.add_argument(
        "--tenant-key-file",
        metavar="FILE",
        default=None,
        help="trust a turn's tenant only when signed with the key in FILE (docs/tenants.md)",
    )
    add_object_store_argument(w)
    w.add_argument(
        "--offload-threshold-bytes",
        type=int,
        default=DEFAULT_THRESHOLD,
        help="values whose JSON is past this go to --object-store by reference "
        f"(default {DEFAULT_THRESHOLD})",
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
    add_access_arguments(ms)
    ms.set_defaults(func=cmd_mcp)

    u = with_bootstrap(sub.add_parser("ui", help="a live web view of turns and the DLQ"))
    u.add_argument(
        "--agent", action="append", default=None, help="repeatable; default: every agent found"
    )
    u.add_argument("--port", type=int, default=8088)
    add_object_store_argument(u)
    u.add_argument("--host", default="127.0.0.1", help="bind address")
    u.add_argument(
        "--allow-actions", action="store_true", help="allow cancel/terminate from the page"
    )
    u.add_argument(
        "--reviewer",
        action="append",
        default=None,
        metavar="KEY_NAME",
        help="an API key name that may answer questions (approve, reject); repeatable; "
        "default: any key that may act",
    )
    u.add_argument(
        "--operator",
        action="append",
        default=None,
        metavar="KEY_NAME",
        help="an API key name that may redrive dead letters; repeatable; "
        "default: any key that may act",
    )
    u.add_argument("--history-minutes", type=float, default=60.0, help="how far back to read")
    u.add_argument("--max-turns", type=int, default=200, help="turns kept per agent")
    add_access_arguments(u)
    u.set_defaults(func=cmd_ui)
