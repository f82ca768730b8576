"""``pyrula-stream``: broker, topics, worker, submit and tail, for people at a terminal."""

from __future__ import annotations

import argparse
import logging
import sys

from pyrula_stream.cli.cluster import cmd_acls, cmd_broker, cmd_schema, cmd_topics
from pyrula_stream.cli.common import (
    KAFKA_TIMEOUT_S,
    add_access_arguments,
    format_event,
    load_agent,
    positive_seconds,
)
from pyrula_stream.cli.running import cmd_mcp, cmd_ui, cmd_worker
from pyrula_stream.cli.turns import (
    cmd_replay,
    cmd_status,
    cmd_submit,
    cmd_tail,
    cmd_thread,
    cmd_turn_export,
)
from pyrula_stream.errors import BrokerUnavailableError, PyrulaError, UserError

__all__ = ["build_parser", "format_event", "load_agent", "main"]


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
    add_access_arguments(ms)
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
    add_access_arguments(u)
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
